"""``get_dataset``: the single entry point that turns a config name into a dataset."""

from .bases import ImageDataset
from .registry import DATASET_REGISTRY

# Short family names accepted before ':' in addition to the registered class names.
ALIASES = {"ImageFolder": "ImageFolderReID"}


def get_dataset(name: str, root: str, combineall: bool = False, **kwargs) -> ImageDataset:
    """Build the dataset named ``name`` (an entry of DATASETS.NAMES / DATASETS.TESTS).

    ``"Market1501"`` looks the class up in :data:`DATASET_REGISTRY`;
    ``"Family:value"`` (e.g. ``"ImageFolder:my_shop"``) passes ``value`` to the keyword
    the class names in its ``NAME_ARGUMENT``.

    Args:
        name: the dataset name from the config.
        root: the data root (see :func:`resolve_data_root`).
        combineall: fold query + gallery into training.
        **kwargs: extra constructor keywords.
    Returns:
        The loaded dataset (its summary table already logged).
    Raises:
        KeyError: an unknown name (the message lists the known ones).
        ValueError: a ``:value`` for a class that takes none.
    """
    family, sep, value = name.partition(":")
    family = ALIASES.get(family, family)
    if family not in DATASET_REGISTRY:
        known = ", ".join(sorted(n for n, _ in DATASET_REGISTRY))
        raise KeyError(f"unknown dataset '{name}'; known: {known}; for your own images use "
                       f"'ImageFolder:<folder under the data root>' (see datasets/README.md)")
    cls = DATASET_REGISTRY.get(family)
    if sep:
        key = getattr(cls, "NAME_ARGUMENT", None)
        if key is None:
            raise ValueError(f"dataset '{family}' takes no ':<value>' argument; write "
                             f"'{family}' in the config")
        kwargs[key] = value
    dataset = cls(root=root, combineall=combineall, **kwargs)
    dataset.show_summary()
    return dataset
