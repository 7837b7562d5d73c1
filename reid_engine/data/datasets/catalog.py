"""``get_dataset``: the single entry point that turns a config name into a dataset."""
from typing import List, Tuple

from reid_engine.config import ConfigError
from reid_engine.utils.registry import lookup

from .bases import ImageDataset
from .registry import DATASET_REGISTRY

# Short family names accepted before ':' in addition to the registered class names.
ALIASES = {"ImageFolder": "ImageFolderReID"}

_OWN_IMAGES_HINT = ("for your own images use 'ImageFolder:<folder under the data root>' "
                    "(see datasets/README.md)")
# The config keys of the training and test sets: a test-only set is refused in the first,
# a training-only set in the second.
NAMES_KEY, TESTS_KEY = "DATASETS.NAMES", "DATASETS.TESTS"


def testable_dataset_names() -> List[str]:
    """The registered names of the sets that have a query and a gallery, sorted."""
    return [name for name in DATASET_REGISTRY.names()
            if not getattr(DATASET_REGISTRY.get(name), "TRAIN_ONLY", False)]


def trainable_dataset_names() -> List[str]:
    """The registered names of the sets that have training images, sorted."""
    return [name for name in DATASET_REGISTRY.names()
            if not getattr(DATASET_REGISTRY.get(name), "TEST_ONLY", False)]


def dataset_class(name: str, key: str = NAMES_KEY) -> Tuple[type, dict]:
    """Resolve a config dataset name to its class and constructor keywords, building nothing.

    ``"Market1501"`` looks the class up in :data:`DATASET_REGISTRY`; ``"Family:value"``
    (e.g. ``"ImageFolder:my_shop"``) passes ``value`` to the keyword the class names in
    its ``NAME_ARGUMENT``.

    Args:
        name: the dataset name from the config.
        key: the config key holding it (named in errors), e.g. ``DATASETS.TESTS``.
    Returns:
        ``(cls, kwargs)``: the dataset class and the keywords the name implies.
    Raises:
        UnknownChoiceError: an unknown name (the message lists the known ones).
        ConfigError: a ``:value`` for a class that takes none, a training-only set
            under ``DATASETS.TESTS`` or a test-only set under ``DATASETS.NAMES``.
    """
    family, sep, value = name.partition(":")
    cls = lookup(DATASET_REGISTRY, ALIASES.get(family, family), key, hint=_OWN_IMAGES_HINT)
    if key == TESTS_KEY and getattr(cls, "TRAIN_ONLY", False):
        raise ConfigError(f"{key}: {family} has training images only (no query / gallery), so it cannot be "
                          f"tested; keep it in DATASETS.NAMES and test on one of "
                          f"{', '.join(testable_dataset_names())}")
    if key == NAMES_KEY and getattr(cls, "TEST_ONLY", False):
        raise ConfigError(f"{key}: {family} has test images only (no training split), so it cannot be trained "
                          f"on; keep it in DATASETS.TESTS and train on one of {', '.join(trainable_dataset_names())}")
    if not sep:
        return cls, {}
    argument = getattr(cls, "NAME_ARGUMENT", None)
    if argument is None:
        raise ConfigError(f"{key}: dataset '{family}' takes no ':<value>' argument; write "
                          f"'{family}' in the config")
    return cls, {argument: value}


def get_dataset(name: str, root: str, combineall: bool = False, key: str = NAMES_KEY,
                split_id: int = 0, **kwargs) -> ImageDataset:
    """Build the dataset named ``name`` (an entry of DATASETS.NAMES / DATASETS.TESTS).

    Args:
        name: the dataset name from the config (see :func:`dataset_class`).
        root: the data root (see :func:`resolve_data_root`).
        combineall: fold query + gallery into training.
        key: the config key holding ``name``, named in errors.
        split_id: ``DATASETS.SPLIT_ID``, passed on to the sets with random train / test
            splits (their class sets ``HAS_SPLITS``) and ignored by the others.
        **kwargs: extra constructor keywords.
    Returns:
        The loaded dataset (its summary table already logged).
    Raises:
        UnknownChoiceError: an unknown name (the message lists the known ones).
        ConfigError: a ``:value`` for a class that takes none.
    """
    cls, name_kwargs = dataset_class(name, key)
    if getattr(cls, "HAS_SPLITS", False):
        kwargs["split_id"] = split_id
    dataset = cls(root=root, combineall=combineall, **name_kwargs, **kwargs)
    dataset.show_summary()
    return dataset
