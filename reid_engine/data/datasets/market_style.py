"""Datasets laid out like Market-1501: three image folders, pid and camera in the file name."""

import os
import re
from typing import List, Sequence, Tuple

from .audit import report_file_problem
from .bases import JUNK_PID, ImageDataset, Item
from .paths import list_images, require_dir

# "0002_c1s1_000451_03.jpg", "-1_c3s2_...", "0001_c2_f0046182.jpg", "0001_c001_00016450_0.jpg"
MARKET_STYLE_NAME = re.compile(r"^(-?\d+)_c(\d+)")


def read_market_style_folder(folder: str, dataset: str, example: str) -> Tuple[List[Item], int]:
    """Parse every image of ``folder`` named ``<pid>_c<camera>...``, counting the junk.

    Args:
        folder: an image folder.
        dataset: the dataset name (for errors).
        example: an example file name shown when a name does not parse.
    Returns:
        ``(items, num_junk)``: sorted ``(path, pid, camid)`` items with camid = camera - 1,
        and the number of junk images (pid -1) left out.
    Raises:
        DatasetFormatError: a file name does not follow the pattern or has camera 0 (see
            :mod:`.audit`: collected instead under ``reid-data check``).
    """
    items, num_junk = [], 0
    for path in list_images(folder):
        match = MARKET_STYLE_NAME.match(os.path.basename(path))
        if match is None:
            report_file_problem(dataset, path, f"a name like '{example}' (<pid>_c<camera>...)")
            continue
        pid, camera = int(match.group(1)), int(match.group(2))
        if pid == JUNK_PID:
            num_junk += 1
            continue
        if camera < 1:
            report_file_problem(dataset, path, f"cameras counted from c1 in the name, not c{camera}")
            continue
        items.append((path, pid, camera - 1))
    return items, num_junk


def parse_market_style_folder(folder: str, dataset: str, example: str) -> List[Item]:
    """The items of :func:`read_market_style_folder` (junk left out, not counted)."""
    return read_market_style_folder(folder, dataset, example)[0]


class MarketStyleDataset(ImageDataset):
    """Base of the datasets with a train / query / gallery folder of Market-style names.

    The dataset folder is found by :attr:`DATASET_DIRS` when a subclass sets it (folders
    under the data root), else by the accepted names of :mod:`.folders`. Subclasses set
    :attr:`SPLIT_DIRS` (train, query, gallery sub-folders), :attr:`NAME_EXAMPLE` and
    :attr:`DISTRACTOR_PIDS`.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    SPLIT_DIRS: Tuple[str, str, str] = ("bounding_box_train", "query", "bounding_box_test")
    NAME_EXAMPLE = "0002_c1s1_000451_03.jpg"
    DISTRACTOR_PIDS: Sequence[int] = (0,)

    def __init__(self, root: str = "datasets", combineall: bool = False):
        layout = ", ".join(f"{d}/" for d in self.SPLIT_DIRS)
        name = self._locate(root, layout)
        train_dir, query_dir, gallery_dir = (
            require_dir(os.path.join(self.dataset_dir, d), name, layout) for d in self.SPLIT_DIRS)
        (train, train_junk), (query, query_junk), (gallery, gallery_junk) = (
            read_market_style_folder(d, name, self.NAME_EXAMPLE) for d in (train_dir, query_dir, gallery_dir))
        gallery += self.extra_gallery()
        super().__init__(train, query, gallery, name, combineall=combineall,
                         distractor_pids=self.DISTRACTOR_PIDS, source=self.dataset_dir,
                         junk_counts={"train": train_junk, "query": query_junk, "gallery": gallery_junk})

    def extra_gallery(self) -> List[Item]:
        """Extra gallery items (distractors); none by default."""
        return []
