"""torchreid's video (tracklet) benchmarks: ``mars``, ``ilidsvid``, ``prid2011``, ``dukemtmcvidreid``.

A tracklet item is ``(tuple of frame paths in temporal order, pid, camid)``; everything that
works on ``(path, pid, camid)`` items by pid and camera (relabelling, merging, identity
samplers, the ranking protocol) works on them unchanged. Registered under torchreid's names
and read from torchreid's folders (datasets/README.md, "Video ReID").
"""

import json
import logging
import os
import re
from typing import Dict, List, Sequence, Tuple

from tabulate import tabulate

from .audit import report_file_problem
from .bases import JUNK_PID, DatasetFormatError, ImageDataset
from .layout import list_files, subfolders
from .matlab import read_mat
from .paths import list_lines, require_dir, require_file
from .registry import DATASET_REGISTRY
from .splits import (
    check_split_id,
    check_split_ids,
    draw_id_splits,
    load_or_draw_splits,
    read_split_file,
    split_mismatch,
)

__all__ = ["VideoDataset", "Tracklet", "is_video_dataset", "mars", "ilidsvid", "prid2011", "dukemtmcvidreid",
           "read_tracklet_folder"]

logger = logging.getLogger(__name__)

Tracklet = Tuple[Tuple[str, ...], int, int]  # (frame paths in temporal order, pid, camid)


def is_video_dataset(dataset) -> bool:
    """Whether ``dataset`` (an instance or a class) holds tracklets instead of images."""
    return bool(getattr(dataset, "IS_VIDEO", False))


class VideoDataset(ImageDataset):
    """Train / query / gallery lists of tracklets ``(frame paths, pid, camid)``.

    Same contract as :class:`ImageDataset` (training pids relabelled, test pids raw, junk
    removed by the parser, distractors kept in the gallery); only the summary counts frames too.
    """

    IS_VIDEO = True

    def show_summary(self) -> None:
        """Log a table of ids / tracklets / cameras / frames per split."""
        rows = [row + [sum(len(paths) for paths, _, _ in items)]
                for row, items in zip(self.summary_rows(), (self.train, self.query, self.gallery))]
        table = tabulate(rows, headers=["subset", "# ids", "# tracklets", "# cameras", "# frames"],
                         tablefmt="pipe", numalign="right")
        logger.info("Loaded %s from %s:\n%s", self.name, self.source, table)


def _frame_number_sorted(paths: Sequence[str], pattern: "re.Pattern[str]") -> List[str]:
    """``paths`` ordered by the integer the pattern's first group finds in each file name."""
    return sorted(paths, key=lambda p: int(pattern.search(os.path.basename(p)).group(1)))


# ---------------------------------------------------------------------------------------- MARS
MARS_NAME = re.compile(r"^(-?\d+|00-1)C(\d)T(\d{4})F(\d{3})")
MARS_LAYOUT = ("bbox_train/<pid4>/*.jpg, bbox_test/<pid4>/*.jpg and info/ (train_name.txt, test_name.txt, "
               "tracks_train_info.mat, tracks_test_info.mat, query_IDX.mat from the MARS-evaluation repo)")


def _read_lines(path: str) -> List[str]:
    return [line for _, line in list_lines(path)]


def _mat_variable(path: str, variable: str, dataset: str):
    """A variable of a .mat file (a one-line error naming the file when it is absent)."""
    data = read_mat(path)
    if variable not in data:
        raise DatasetFormatError(f"{dataset}: '{path}' has no variable '{variable}' (it holds {sorted(data)}); "
                                 f"restore the file from the dataset release")
    return data[variable]


@DATASET_REGISTRY.register()
class mars(VideoDataset):  # noqa: N801 (torchreid's registered name)
    """MARS: 1,261 ids, 8,298 train / 1,980 query / 9,330 gallery tracklets, 6 cameras.

    Each row ``[start, end, pid, camera]`` of ``info/tracks_{train,test}_info.mat`` is a
    tracklet: the 1-based inclusive lines start..end of ``{train,test}_name.txt``, frames in
    ``bbox_{train,test}/<first 4 characters of the name>/``. pid -1 is junk (skipped); pid 0
    marks distractors (kept in the gallery, never matched). Query = the test rows listed in
    ``query_IDX.mat`` (1-based); gallery = the other test rows.

    Args:
        root: the data root.
        combineall: ignored (a no-op in torchreid too).
    """

    LAYOUT = MARS_LAYOUT

    def __init__(self, root: str = "datasets", combineall: bool = False):
        name = self._locate(root)
        info = require_dir(os.path.join(self.dataset_dir, "info"), name, MARS_LAYOUT)
        junk: Dict[str, int] = {"train": 0, "query": 0, "gallery": 0}
        splits = {}
        for split in ("train", "test"):
            names = _read_lines(require_file(os.path.join(info, f"{split}_name.txt"), name, MARS_LAYOUT))
            rows = _mat_variable(require_file(os.path.join(info, f"tracks_{split}_info.mat"), name, MARS_LAYOUT),
                                 f"track_{split}_info", name)
            folder = require_dir(os.path.join(self.dataset_dir, f"bbox_{split}"), name, MARS_LAYOUT)
            splits[split] = [self._tracklet(row, names, folder) for row in rows.reshape(-1, 4)]
        query_rows = _mat_variable(require_file(os.path.join(info, "query_IDX.mat"), name, MARS_LAYOUT),
                                   "query_IDX", name)
        query_index = {int(i) - 1 for i in query_rows.reshape(-1)}
        kept: Dict[str, List[Tracklet]] = {"train": [], "query": [], "gallery": []}
        rows = [("train", item) for item in splits["train"]]
        rows += [("query" if index in query_index else "gallery", item) for index, item in enumerate(splits["test"])]
        for split, item in rows:
            if item[1] == JUNK_PID:  # junk: never trained on, never ranked
                junk[split] += 1
            else:
                kept[split].append(item)
        train, query, gallery = kept["train"], kept["query"], kept["gallery"]
        super().__init__(train, query, gallery, name, combineall=False, distractor_pids=(0,),
                         source=self.dataset_dir, junk_counts=junk)

    def _tracklet(self, row, names: List[str], folder: str) -> Tracklet:
        """The tracklet of one info row; frame names are checked against the row's pid."""
        start, end, pid, camera = (int(v) for v in row)
        if not 1 <= start <= end <= len(names):
            raise DatasetFormatError(f"mars: the info row {[start, end, pid, camera]} points outside the "
                                     f"{len(names)} names of the name list; restore info/ from the "
                                     f"MARS-evaluation repo")
        frames = names[start - 1:end]
        if pid != JUNK_PID:
            match = MARS_NAME.match(frames[0])
            if match is None or int(match.group(1)) != pid:
                report_file_problem("mars", os.path.join(folder, frames[0][:4], frames[0]),
                                    f"a name like '0001C1T0001F001.jpg' whose first 4 digits are the row's pid {pid}",
                                    fix="restore the name lists and bbox folders of the same release")
        return tuple(os.path.join(folder, frame[:4], frame) for frame in frames), pid, camera - 1


# ------------------------------------------------------------------------------------- iLIDS-VID
ILIDSVID_LAYOUT = ("i-LIDS-VID/sequences/cam1|cam2/personNNN/*.png and 'train-test people splits/"
                   "train_test_splits_ilidsvid.mat'")
_TRAILING_NUMBER = re.compile(r"(\d+)\.\w+$")


def read_tracklet_folder(folder: str, dataset: str, extension: str, pattern: "re.Pattern[str]",
                         rule: str) -> Tuple[str, ...]:
    """The frames of one tracklet folder, in the order of the frame number ``pattern`` captures.

    Args:
        folder: the tracklet folder.
        dataset: the dataset name (for errors).
        extension: the frame extension, e.g. ``".png"``.
        pattern: finds the frame number (group 1) in a file name.
        rule: the expected name, for errors.
    Returns:
        The frame paths (empty when the folder holds no frames).
    """
    frames = []
    for path in list_files(folder, extension, dataset):
        if pattern.search(os.path.basename(path)) is None:
            report_file_problem(dataset, path, rule)
        else:
            frames.append(path)
    return tuple(_frame_number_sorted(frames, pattern))


@DATASET_REGISTRY.register()
class ilidsvid(VideoDataset):  # noqa: N801 (torchreid's registered name)
    """iLIDS-VID: 300 people, one tracklet per camera (2 cameras), 10 release splits.

    Split ``DATASETS.SPLIT_ID`` of ``ls_set`` (10 x 300, 1-based indices into the sorted
    cam1 person folders): the first 150 people test, the last 150 train. pid = the person's
    position among the split's (sorted) people; query = the test people's cam1 tracklets,
    gallery = their cam2 tracklets.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        split_id: DATASETS.SPLIT_ID (0..9).
    """

    HAS_SPLITS = True
    LAYOUT = ILIDSVID_LAYOUT

    def __init__(self, root: str = "datasets", combineall: bool = False, split_id: int = 0):
        name = self._locate(root)
        sequences = os.path.join(self.dataset_dir, "i-LIDS-VID", "sequences")
        cams = [require_dir(os.path.join(sequences, cam), name, ILIDSVID_LAYOUT) for cam in ("cam1", "cam2")]
        people = subfolders(cams[0], name, "inside personNNN/ sub-folders")
        split_path = require_file(os.path.join(self.dataset_dir, "train-test people splits",
                                               "train_test_splits_ilidsvid.mat"), name, ILIDSVID_LAYOUT)
        ls_set = _mat_variable(split_path, "ls_set", name)
        ls_set = ls_set.reshape(ls_set.shape[0], -1)
        row = ls_set[check_split_id(split_id, ls_set.shape[0], split_path, name)]
        if row.max() > len(people) or row.min() < 1:
            raise split_mismatch(split_path, name, f"it indexes person {int(row.max())} but cam1/ holds "
                                                   f"{len(people)} person folders")
        half = len(row) // 2
        test = [people[int(i) - 1] for i in sorted(row[:half])]
        train = [people[int(i) - 1] for i in sorted(row[half:])]
        rule = "frames named like 'cam1_person001_00317.png' (trailing frame number)"

        def tracklets(persons: List[str], camid: int) -> List[Tracklet]:
            found = []
            for pid, person in enumerate(persons):
                folder = require_dir(os.path.join(cams[camid], person), name, ILIDSVID_LAYOUT)
                frames = read_tracklet_folder(folder, name, ".png", _TRAILING_NUMBER, rule)
                if frames:
                    found.append((frames, pid, camid))
            return found

        super().__init__(tracklets(train, 0) + tracklets(train, 1), tracklets(test, 0), tracklets(test, 1), name,
                         combineall=combineall, distractor_pids=(), source=self.dataset_dir)


# -------------------------------------------------------------------------------------- PRID2011
PRID2011_LAYOUT = "prid_2011/multi_shot/cam_a|cam_b/person_NNNN/*.png"
# torchreid's split file (from the iLIDS-VID authors); without it, splits are drawn and kept here.
PRID2011_TORCHREID_SPLITS = "splits_prid2011.json"
PRID2011_DRAWN_SPLITS = "splits_reid_engine_video.json"  # not splits_reid_engine.json: single-shot `prid` owns it


@DATASET_REGISTRY.register()
class prid2011(VideoDataset):  # noqa: N801 (torchreid's registered name)
    """PRID2011 multi-shot: one tracklet per person per camera (cam_a, cam_b).

    The split is entry ``DATASETS.SPLIT_ID`` of ``prid2011/splits_prid2011.json`` (torchreid's
    file, a list of ``{"train": [person folders], "test": [...]}``) when present; otherwise
    10 seeded half / half draws over the people seen by both cameras, kept in
    ``prid2011/splits_reid_engine_video.json``. pid = the position in the split's list;
    query = cam_a, gallery = cam_b.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        split_id: DATASETS.SPLIT_ID.
    """

    HAS_SPLITS = True
    LAYOUT = PRID2011_LAYOUT

    def __init__(self, root: str = "datasets", combineall: bool = False, split_id: int = 0):
        name = self._locate(root)
        base = os.path.join(self.dataset_dir, "prid_2011", "multi_shot")
        cams = [require_dir(os.path.join(base, cam), name, PRID2011_LAYOUT) for cam in ("cam_a", "cam_b")]
        both = sorted(set(subfolders(cams[0])) & set(subfolders(cams[1])))
        split_path = os.path.join(self.dataset_dir, PRID2011_TORCHREID_SPLITS)
        if os.path.isfile(split_path):
            draws = _read_torchreid_splits(split_path, name)
        else:
            split_path = os.path.join(self.dataset_dir, PRID2011_DRAWN_SPLITS)
            draws = load_or_draw_splits(split_path, name, lambda rng: draw_id_splits(both, rng), ("train", "test"))
        split = draws[check_split_id(split_id, len(draws), split_path, name)]
        check_split_ids(split, both, split_path, name)
        rule = "frames named like '0001.png' (trailing frame number)"

        def tracklets(persons: List[str], camids: Sequence[int]) -> List[Tracklet]:
            found = []
            for camid in camids:
                for pid, person in enumerate(persons):
                    frames = read_tracklet_folder(os.path.join(cams[camid], person), name, ".png",
                                                  _TRAILING_NUMBER, rule)
                    if frames:
                        found.append((frames, pid, camid))
            return found

        super().__init__(tracklets(split["train"], (0, 1)), tracklets(split["test"], (0,)),
                         tracklets(split["test"], (1,)), name, combineall=combineall, distractor_pids=(),
                         source=self.dataset_dir)


def _read_torchreid_splits(path: str, dataset: str) -> List[Dict[str, list]]:
    """torchreid's ``[{"train": [...], "test": [...]}, ...]`` (also accepted wrapped as ours)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        data = None
    if isinstance(data, dict):
        return read_split_file(path, dataset, ("train", "test"))
    if (not isinstance(data, list) or not data
            or not all(isinstance(s, dict) and isinstance(s.get("train"), list) and isinstance(s.get("test"), list)
                       for s in data)):
        raise split_mismatch(path, dataset, 'expected a JSON list of {"train": [...], "test": [...]}')
    return data


# ---------------------------------------------------------------------------- DukeMTMC-VideoReID
DUKEVID_LAYOUT = "DukeMTMC-VideoReID/{train,query,gallery}/<pid4>/<tracklet folder>/*.jpg"
# New form "0001_C6_F0099_X30823.jpg" and old form "0001C6F0099X30823.jpg".
DUKEVID_NAME = re.compile(r"^\d+_?C(\d+)_?F(\d+)")
_DUKEVID_FRAME = re.compile(r"^\d+_?C\d+_?F(\d+)")


@DATASET_REGISTRY.register()
class dukemtmcvidreid(VideoDataset):  # noqa: N801 (torchreid's registered name)
    """DukeMTMC-VideoReID: 702 train + 702 test ids, every ``<pid>/<tracklet>/`` folder one tracklet.

    pid = the integer of the person folder; camid = the digit after ``C`` in the frame
    names minus 1; frames are ordered by their ``F`` number. Tracklets shorter than
    :attr:`MIN_SEQ_LEN` frames are dropped.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    LAYOUT = DUKEVID_LAYOUT
    MIN_SEQ_LEN = 0  # torchreid's min_seq_len

    def __init__(self, root: str = "datasets", combineall: bool = False):
        name = self._locate(root)
        train, query, gallery = (self._read_split(require_dir(os.path.join(self.dataset_dir, split), name,
                                                              self.LAYOUT), name)
                                 for split in ("train", "query", "gallery"))
        super().__init__(train, query, gallery, name, combineall=combineall, distractor_pids=(),
                         source=self.dataset_dir)

    def _read_split(self, folder: str, name: str) -> List[Tracklet]:
        """Every tracklet folder of one split folder."""
        rule = "a name like '0001_C6_F0099_X30823.jpg' (or '0001C6F0099X30823.jpg')"
        items = []
        for person in subfolders(folder, name, "inside <pid>/<tracklet>/ sub-folders"):
            if not person.lstrip("-").isdigit():
                report_file_problem(name, os.path.join(folder, person), "person folders named by the integer pid")
                continue
            pid = int(person)
            for tracklet in subfolders(os.path.join(folder, person), name, "inside <tracklet>/ sub-folders"):
                frames = read_tracklet_folder(os.path.join(folder, person, tracklet), name, ".jpg",
                                              _DUKEVID_FRAME, rule)
                if not frames or len(frames) < self.MIN_SEQ_LEN:
                    continue
                camera = int(DUKEVID_NAME.match(os.path.basename(frames[0])).group(1))
                if camera < 1:
                    report_file_problem(name, frames[0], "cameras counted from C1 in the name")
                    continue
                items.append((frames, pid, camera - 1))
        return items

