"""CUHK03 with the new (CUHK03-NP) protocol of Zhong et al., CVPR 2017."""

from .market_style import MarketStyleDataset
from .registry import DATASET_REGISTRY


@DATASET_REGISTRY.register()
class CUHK03(MarketStyleDataset):
    """CUHK03-NP: 767 train ids / ~7,365 images; 1,400 queries; ~5,332 gallery.

    Folder ``cuhk03-np/detected/`` (default) or ``cuhk03-np/labeled/`` with Market-style
    ``bounding_box_train/``, ``query/``, ``bounding_box_test/``.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        labeled: use the hand-labelled boxes instead of the detected ones.
    """

    NAME_EXAMPLE = "0001_c1_1.png"

    def __init__(self, root: str = "datasets", combineall: bool = False, labeled: bool = False):
        self.labeled = labeled
        self.DATASET_DIRS = ("cuhk03-np/labeled",) if labeled else ("cuhk03-np/detected",)
        super().__init__(root, combineall=combineall)


@DATASET_REGISTRY.register()
class CUHK03Labeled(CUHK03):
    """CUHK03-NP with the hand-labelled boxes (``cuhk03-np/labeled/``)."""

    def __init__(self, root: str = "datasets", combineall: bool = False):
        super().__init__(root, combineall=combineall, labeled=True)
