"""VeRi-776 vehicle re-identification (Liu et al., ECCV 2016 / ICME 2016)."""

from .market_style import MarketStyleDataset
from .registry import DATASET_REGISTRY


@DATASET_REGISTRY.register()
class VeRi(MarketStyleDataset):
    """VeRi-776: folder ``VeRi/`` (or fast-reid's ``veri/``) with ``image_train/``, ``image_query/``, ``image_test/``.

    Names ``0001_c001_00016450_0.jpg``: vehicle id 1, camid 0. Vehicle ids have no
    distractor value, so COMBINEALL folds every test id into training.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    SPLIT_DIRS = ("image_train", "image_query", "image_test")
    NAME_EXAMPLE = "0001_c001_00016450_0.jpg"
    DISTRACTOR_PIDS = ()
