"""DukeMTMC-reID (Zheng et al., ICCV 2017)."""

from .market_style import MarketStyleDataset
from .registry import DATASET_REGISTRY


@DATASET_REGISTRY.register()
class DukeMTMC(MarketStyleDataset):
    """DukeMTMC-reID: 702 train ids / 16,522 images; 2,228 queries; 17,661 gallery.

    Folder ``DukeMTMC-reID/`` (or torchreid's ``dukemtmc-reid/DukeMTMC-reID/``) with ``bounding_box_train/``, ``query/``,
    ``bounding_box_test/``; names ``0001_c2_f0046182.jpg`` (pid 1, camid 1).

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    NAME_EXAMPLE = "0001_c2_f0046182.jpg"
