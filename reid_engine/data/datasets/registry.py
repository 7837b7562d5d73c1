"""The registry of dataset classes, looked up by name (e.g. ``"Market1501"``)."""

from reid_engine.utils.registry import Registry

DATASET_REGISTRY = Registry("DATASET")
DATASET_REGISTRY.__doc__ = """
Dataset classes by DATASETS.NAMES / TESTS entry (build contract: utils.registry).
``cls(root=<data root>, combineall=False, **kwargs)`` returns an :class:`ImageDataset`
with ``train`` / ``query`` / ``gallery`` lists of ``(img_path, pid, camid)``.
"""
