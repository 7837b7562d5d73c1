"""Market-1501 (Zheng et al., ICCV 2015), optionally with its 500k distractor gallery."""

import os
from typing import List

from .bases import Item
from .market_style import MarketStyleDataset, parse_market_style_folder
from .paths import require_dir
from .registry import DATASET_REGISTRY


@DATASET_REGISTRY.register()
class Market1501(MarketStyleDataset):
    """Market-1501: 751 train ids / 12,936 images; 3,368 queries; 15,913 gallery.

    Folder ``Market-1501-v15.09.15/`` (or torchreid's ``market1501/Market-1501-v15.09.15/``
    or ``market1501/``) under the data root with ``bounding_box_train/``, ``query/``, ``bounding_box_test/`` and, for the
    500k variant, ``images/`` (the distractors, added to the gallery with pid 0).

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        market500k: add the 500k distractor images of ``images/`` to the gallery.
    """

    def __init__(self, root: str = "datasets", combineall: bool = False,
                 market500k: bool = False):
        self.market500k = market500k
        super().__init__(root, combineall=combineall)

    def extra_gallery(self) -> List[Item]:
        """The 500k distractors (pid 0, camera from the name) when ``market500k`` is set."""
        if not self.market500k:
            return []
        name = type(self).__name__
        folder = require_dir(os.path.join(self.dataset_dir, "images"), name,
                             "images/ with the 500k distractor images")
        # Every image of the distractor set is a negative, whatever its name's id field says.
        return [(path, 0, camid) for path, _, camid
                in parse_market_style_folder(folder, name, self.NAME_EXAMPLE)]


@DATASET_REGISTRY.register()
class Market1501_500k(Market1501):  # noqa: N801 (the registered name is the public API)
    """Market-1501 with the 500k distractor images added to the gallery."""

    def __init__(self, root: str = "datasets", combineall: bool = False):
        super().__init__(root, combineall=combineall, market500k=True)
