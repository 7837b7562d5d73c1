"""The image-dataset base class and the merging of several training sets."""

import logging
from collections import defaultdict
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from tabulate import tabulate

from ..errors import DatasetFormatError
from .folders import dataset_folders
from .paths import find_dataset_dir

logger = logging.getLogger(__name__)

Item = Tuple[str, int, int]  # (img_path, pid, camid), camid 0-based

JUNK_PID = -1


def _relabel(pids: Iterable[int]) -> Dict[int, int]:
    """Map the distinct values of ``pids`` (sorted) to 0..N-1."""
    return {pid: label for label, pid in enumerate(sorted(set(pids)))}


class ImageDataset:
    """Train / query / gallery lists of ``(img_path, pid, camid)`` for one benchmark.

    Training pids are relabelled to 0..N-1 (sorted by original pid); query and gallery keep
    their original pids. With ``combineall`` the query and gallery images are folded into
    training as identities distinct from the training ones (distractors excluded).

    Args:
        train, query, gallery: lists of ``(img_path, pid, camid)`` with original pids, junk
            (pid -1) already removed, camids 0-based.
        name: the dataset name (used as the id / camera prefix when sets are merged).
        combineall: fold query + gallery into training.
        distractor_pids: pids that mark distractors (never used as training identities).
        source: where the data was read from (only for error messages).
        junk_counts: images dropped as junk per split (``{"gallery": 2798}``), for reports;
            leave it out when the dataset has no junk marker.
    Raises:
        DatasetFormatError: an empty split, or a test set where no query has a cross-camera
            match in the gallery.
    """

    # True for sets that only have training images (query and gallery stay empty): they
    # cannot be listed in DATASETS.TESTS.
    TRAIN_ONLY = False
    # True for sets that only have test images (train stays empty): they cannot be listed
    # in DATASETS.NAMES.
    TEST_ONLY = False
    # What the dataset folder holds, for the errors that name a missing folder or file.
    LAYOUT = ""
    # The accepted dataset folders under the data root, when a class (or an instance) reads
    # others than its entry of folders.DATASET_FOLDERS.
    DATASET_DIRS: Sequence[str] = ()

    def __init__(self, train: Sequence[Item], query: Sequence[Item], gallery: Sequence[Item],
                 name: str, combineall: bool = False, distractor_pids: Sequence[int] = (0,),
                 source: str = "", junk_counts: Optional[Mapping[str, int]] = None):
        self.name = name
        self.source = source or name
        self.combineall = bool(combineall)
        self.distractor_pids = frozenset(distractor_pids)
        self.junk_counts: Dict[str, int] = dict(junk_counts or {})
        for split, items in (("train", train), ("query", query), ("gallery", gallery)):
            if not items and not (self.TEST_ONLY if split == "train" else self.TRAIN_ONLY):
                raise DatasetFormatError(
                    f"{name}: the {split} split is empty (read from '{self.source}'); "
                    f"check that its folder / list file holds images named as documented "
                    f"in datasets/README.md")
        self.query: List[Item] = list(query)
        self.gallery: List[Item] = list(gallery)
        if not self.TRAIN_ONLY:
            check_cross_camera_matches(self.query, self.gallery, name)
        self.train: List[Item] = self._build_train(list(train))

    def _locate(self, root: str, layout: str = "") -> str:
        """Find this dataset's folder under ``root`` and keep it as ``self.dataset_dir``.

        The folder is the first existing one of :attr:`DATASET_DIRS`, else of the class's
        accepted names (:func:`.folders.dataset_folders`); a subclass calls this first.

        Args:
            root: the data root.
            layout: what the folder holds, for the not-found error (default :attr:`LAYOUT`).
        Returns:
            The dataset name (the class name), for messages.
        Raises:
            DatasetNotFoundError: none of the accepted folders exists.
        """
        name = type(self).__name__
        self.dataset_dir = find_dataset_dir(root, name, self.DATASET_DIRS or dataset_folders(type(self)),
                                            layout or self.LAYOUT)
        return name

    def _build_train(self, train: List[Item]) -> List[Item]:
        """Relabel training pids to 0..N-1; append relabelled test ids under COMBINEALL."""
        mapping = _relabel(pid for _, pid, _ in train)
        items = [(path, mapping[pid], camid) for path, pid, camid in train]
        if self.combineall:
            extra = [it for it in self.query + self.gallery
                     if it[1] not in self.distractor_pids and it[1] != JUNK_PID]
            extra_map = _relabel(pid for _, pid, _ in extra)
            offset = len(mapping)
            items += [(path, offset + extra_map[pid], camid) for path, pid, camid in extra]
        return items

    @property
    def num_train_pids(self) -> int:
        """Number of training identities (after COMBINEALL folding)."""
        return len({pid for _, pid, _ in self.train})

    @property
    def num_train_cams(self) -> int:
        """Number of distinct cameras among the training images."""
        return len({camid for _, _, camid in self.train})

    def summary_rows(self) -> List[List]:
        """Return ``[[split, ids, images, cameras], ...]`` for train, query and gallery."""
        rows = []
        for split, items in (("train", self.train), ("query", self.query),
                             ("gallery", self.gallery)):
            rows.append([split, len({p for _, p, _ in items}), len(items),
                         len({c for _, _, c in items})])
        return rows

    def show_summary(self) -> None:
        """Log a table of ids / images / cameras per split."""
        table = tabulate(self.summary_rows(), headers=["subset", "# ids", "# images", "# cameras"],
                         tablefmt="pipe", numalign="right")
        extra = " (COMBINEALL: query + gallery folded into train)" if self.combineall else ""
        logger.info("Loaded %s from %s%s:\n%s", self.name, self.source, extra, table)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, train={len(self.train)}, "
                f"query={len(self.query)}, gallery={len(self.gallery)})")


def check_cross_camera_matches(query: Sequence[Item], gallery: Sequence[Item], name: str) -> int:
    """Count queries with a same-pid gallery image from another camera; error if there are none.

    Args:
        query, gallery: lists of ``(img_path, pid, camid)``.
        name: the dataset name for the error message.
    Returns:
        The number of queries that the ranking protocol will count.
    Raises:
        DatasetFormatError: no query has a cross-camera match.
    """
    cams_of_pid: Dict[int, Set[int]] = defaultdict(set)
    for _, pid, camid in gallery:
        cams_of_pid[pid].add(camid)
    valid = sum(1 for _, pid, camid in query
                if cams_of_pid.get(pid) and (len(cams_of_pid[pid]) > 1
                                              or camid not in cams_of_pid[pid]))
    if valid == 0:
        raise DatasetFormatError(
            f"{name}: no query has a gallery image of the same id from another camera, so "
            f"nothing can be evaluated; the usual cause is that every image shares one camera "
            f"id (check the camera field of the file names or the camera column)")
    return valid


def merge_train_sets(datasets: Sequence[ImageDataset]) -> Tuple[List[Item], int, int]:
    """Merge the training splits of several datasets into one relabelled list.

    Ids and cameras are keyed by a dataset prefix (``"Market1501_2"``) so that pid 2 of one
    set and pid 2 of another stay different identities, then relabelled to 0..N-1 in
    dataset order (and sorted pid order within a dataset).

    Args:
        datasets: the training datasets, in ``DATASETS.NAMES`` order.
    Returns:
        ``(items, num_classes, num_cams)`` with items ``(img_path, pid, camid)``.
    Raises:
        ValueError: no datasets, or one dataset name given twice.
    """
    if not datasets:
        raise ValueError("merge_train_sets: no training datasets given; set DATASETS.NAMES")
    names = [d.name for d in datasets]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"training set(s) {dup} given twice; list each dataset once in "
                         f"DATASETS.NAMES")
    pid_map: Dict[str, int] = {}
    cam_map: Dict[str, int] = {}
    for ds in datasets:
        for pid in sorted({p for _, p, _ in ds.train}):
            pid_map[f"{ds.name}_{pid}"] = len(pid_map)
        for cam in sorted({c for _, _, c in ds.train}):
            cam_map[f"{ds.name}_{cam}"] = len(cam_map)
    items = [(path, pid_map[f"{ds.name}_{pid}"], cam_map[f"{ds.name}_{cam}"])
             for ds in datasets for path, pid, cam in ds.train]
    return items, len(pid_map), len(cam_map)
