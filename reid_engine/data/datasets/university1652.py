"""University-1652 (Zheng et al., ACM MM 2020), drone-to-satellite retrieval as torchreid runs it."""

import os
from typing import List, Tuple

from .audit import report_file_problem
from .bases import ImageDataset
from .layout import list_files, subfolders
from .paths import require_dir
from .registry import DATASET_REGISTRY

__all__ = ["university1652"]

# torchreid's accepted extensions (it compares them in lower case).
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_EXTENSIONS_BOTH_CASES = EXTENSIONS + tuple(ext.upper() for ext in EXTENSIONS)


def read_building_folders(folder: str, dataset: str) -> List[Tuple[str, int]]:
    """Read ``folder/<building number>/<image>``: ``(path, building)`` sorted by building, then name."""
    items = []
    for building in subfolders(folder, dataset, "inside <building number>/ sub-folders"):
        building_dir = os.path.join(folder, building)
        if not building.isdigit():
            report_file_problem(dataset, building_dir, "a folder named by its building number (e.g. 0839)",
                                fix="rename the folder or move it away")
            continue
        items += [(path, int(building)) for path in list_files(building_dir, _EXTENSIONS_BOTH_CASES, dataset)]
    return sorted(items, key=lambda item: (item[1], item[0]))


@DATASET_REGISTRY.register()
class university1652(ImageDataset):  # noqa: N801 (torchreid's registered name)
    """University-1652, drone queries against satellite gallery: 701 train / 701 query / 951 gallery buildings.

    ``university1652/University-Release/``: train = ``train/<view>/<building>/<image>`` over
    every view folder (a building keeps one id across views); query =
    ``test/query_drone/<building>/<image>``; gallery = ``test/gallery_satellite/<building>/<image>``.
    The id is the building number. There are no cameras: every image gets its own camid
    (one counter over train, query and gallery), so the same-camera rule never drops a match.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    LAYOUT = ("train/<view>/<building>/ and test/query_drone/<building>/, test/gallery_satellite/<building>/ "
              "image folders")

    def __init__(self, root: str = "datasets", combineall: bool = False):
        name = self._locate(root)

        def folder(*parts: str) -> str:
            return require_dir(os.path.join(self.dataset_dir, *parts), name, self.LAYOUT)

        train_dir = folder("train")
        train = [item for view in subfolders(train_dir, name, "inside <view>/<building>/ sub-folders")
                 for item in read_building_folders(os.path.join(train_dir, view), name)]
        query = read_building_folders(folder("test", "query_drone"), name)
        gallery = read_building_folders(folder("test", "gallery_satellite"), name)
        # One running fake camera id over the three splits, in this order.
        splits, camid = [], 0
        for pairs in (train, query, gallery):
            splits.append([(path, building, camid + i) for i, (path, building) in enumerate(pairs)])
            camid += len(pairs)
        super().__init__(*splits, name, combineall=combineall, distractor_pids=(), source=self.dataset_dir)
