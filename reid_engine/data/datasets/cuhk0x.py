"""CUHK01 and CUHK02 (Li et al., ACCV 2012 / CVPR 2013) as torchreid evaluates them."""

import os
import re
from typing import List

from .bases import ImageDataset, Item
from .layout import list_files, match_names, text_labels
from .paths import DatasetNotFoundError, require_dir
from .registry import DATASET_REGISTRY
from .splits import SPLIT_FILE_NAME, pick_id_split

__all__ = ["cuhk01", "cuhk02"]


@DATASET_REGISTRY.register()
class cuhk01(ImageDataset):  # noqa: N801 (torchreid's registered name)
    """CUHK01: 971 people / 3,884 images (two views of two images each), 20 splits.

    ``cuhk01/campus/<pid 4 digits><image 3 digits>.png`` (e.g. ``0001001.png``): pid = the
    number - 1; images 1-2 are view 0 and 3-4 view 1 (the camid). Each of 10 seeded draws
    trains on 485 people and tests on the rest, once with view 0 as the query and once with
    view 1 (SPLIT_ID 0..19, as in torchreid). Test pids keep their 0-based values.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        split_id: DATASETS.SPLIT_ID.
    """

    HAS_SPLITS = True
    LAYOUT = "campus/ with images named <pid 4 digits><image 3 digits>.png (e.g. 0001001.png)"
    NAME = re.compile(r"(\d{4})((?!000)\d{3})\.png$")
    RULE = "a name <pid 4 digits><image 001-999>.png (e.g. 0001001.png)"

    def __init__(self, root: str = "datasets", combineall: bool = False, split_id: int = 0):
        name = self._locate(root)
        campus = os.path.join(self.dataset_dir, "campus")
        if not os.path.isdir(campus) and os.path.isfile(os.path.join(self.dataset_dir, "CUHK01.zip")):
            raise DatasetNotFoundError(f"{name}: '{campus}' is missing but CUHK01.zip is there; extract it into "
                                       f"'{self.dataset_dir}' (it holds campus/)")
        campus = require_dir(campus, name, self.LAYOUT)
        images = [(path, int(m.group(1)) - 1, (int(m.group(2)) - 1) // 2)
                  for path, m in match_names(list_files(campus, ".png", name), self.NAME, name, self.RULE)]
        pids = sorted({pid for _, pid, _ in images})
        self.split_path = os.path.join(self.dataset_dir, SPLIT_FILE_NAME)
        draw, view1_is_query = pick_id_split(self.split_path, name, pids, split_id, two_way=True)
        train_ids, test_ids = set(draw["train"]), set(draw["test"])
        train = [item for item in images if item[1] in train_ids]
        views = [[item for item in images if item[1] in test_ids and item[2] == view] for view in (0, 1)]
        query, gallery = (views[1], views[0]) if view1_is_query else (views[0], views[1])
        super().__init__(train, query, gallery, name, combineall=combineall, distractor_pids=(),
                         source=self.dataset_dir)


@DATASET_REGISTRY.register()
class cuhk02(ImageDataset):
    """CUHK02: 1,816 people in five camera pairs; P1-P4 train, P5 test (fixed protocol).

    ``cuhk02/Dataset/P1..P5/cam1|cam2/<pid>_<k>.png``. Ids are per pair: the same number in
    two pairs is two people, so training ids are numbered pair by pair (sorted within a
    pair, so the labels never change between runs). camid counts the camera folders in
    order: P1/cam1 = 0 ... P4/cam2 = 7, P5/cam1 = 8 (query), P5/cam2 = 9 (gallery). Test
    pids are the name's number.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    LAYOUT = "P1/ ... P5/, each with cam1/ and cam2/ holding images named <pid>_<k>.png"
    PAIRS = ("P1", "P2", "P3", "P4", "P5")
    TEST_PAIR = "P5"
    NAME = re.compile(r"(\d+)_")
    RULE = "a name <pid>_<k>.png with a numeric pid"

    def __init__(self, root: str = "datasets", combineall: bool = False):
        name = self._locate(root)
        train: List[Item] = []
        query: List[Item] = []
        gallery: List[Item] = []
        camid = 0
        for pair in self.PAIRS:
            cams = []
            for cam in ("cam1", "cam2"):
                folder = require_dir(os.path.join(self.dataset_dir, pair, cam), name, self.LAYOUT)
                cams.append(match_names(list_files(folder, ".png", name), self.NAME, name, self.RULE))
            if pair == self.TEST_PAIR:
                query = [(path, int(m.group(1)), camid) for path, m in cams[0]]
                gallery = [(path, int(m.group(1)), camid + 1) for path, m in cams[1]]
            else:
                # Ids of earlier pairs come first: offset this pair's labels past them.
                labels = text_labels(m.group(1) for images in cams for _, m in images)
                offset = len({pid for _, pid, _ in train})
                train += [(path, offset + labels[m.group(1)], camid + view)
                          for view, images in enumerate(cams) for path, m in images]
            camid += 2
        super().__init__(train, query, gallery, name, combineall=combineall, distractor_pids=(),
                         source=self.dataset_dir)
