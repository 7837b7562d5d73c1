"""The registry of dataset classes, looked up by name (e.g. ``"Market1501"``)."""

try:
    from reid_engine.utils.registry import Registry
except ImportError:  # utils.registry is a one-line re-export of fvcore's; tolerate its absence
    from fvcore.common.registry import Registry

DATASET_REGISTRY = Registry("DATASET")
DATASET_REGISTRY.__doc__ = """
Dataset classes by name. ``cls(root=<data root>, combineall=False, **kwargs)`` returns an
:class:`ImageDataset` with ``train`` / ``query`` / ``gallery`` lists of
``(img_path, pid, camid)``.
"""
