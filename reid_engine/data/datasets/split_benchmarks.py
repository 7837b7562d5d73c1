"""torchreid's small person benchmarks with several train / test splits: ``viper``, ``ilids``, ``prid``, ``grid``.

Registered under torchreid's (lowercase) names and read from torchreid's folders; the
split is picked with ``DATASETS.SPLIT_ID``: from the random draws :mod:`.splits` keeps
beside the data, or for ``grid`` from the partitions of the release. fast-reid's
training-only versions are the capitalised ``VIPeR``, ``iLIDS``, ``PRID`` and ``GRID``
(:mod:`.training_only`).
"""

import os
import random
import re
from collections import defaultdict
from typing import Dict, List

from .bases import DatasetFormatError, ImageDataset, Item
from .layout import list_files, match_names
from .matlab import read_mat
from .paths import DatasetNotFoundError, require_dir, require_file
from .registry import DATASET_REGISTRY
from .splits import (  # two_way_split: re-exported, it used to live here
    SPLIT_FILE_NAME,
    Split,
    check_split_id,
    load_or_draw_splits,
    pick_id_split,
    shuffled_halves,
    split_mismatch,
    two_way_split,
)

__all__ = ["viper", "ilids", "prid", "grid", "two_way_split", "read_grid_partitions"]


@DATASET_REGISTRY.register()
class viper(ImageDataset):  # noqa: N801 (torchreid's registered name)
    """VIPeR as torchreid evaluates it: 632 people, one image per camera, 20 splits.

    ``viper/VIPeR/cam_a/*.bmp`` and ``cam_b/*.bmp``; the sorted file lists of the two
    folders are paired by position (person i = the i-th file of each). Each of 10 seeded
    draws puts 316 people in train and 316 in test, once with cam_a as the query and once
    with cam_b (SPLIT_ID 0..19, as in torchreid). camid 0 = cam_a, 1 = cam_b; test pids are
    the people's positions in the split's test list (0..315).

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        split_id: DATASETS.SPLIT_ID.
    """

    HAS_SPLITS = True
    LAYOUT = "cam_a/ and cam_b/ holding one *.bmp image per person each, paired by sorted name"

    def __init__(self, root: str = "datasets", combineall: bool = False, split_id: int = 0):
        name = self._locate(root)
        cam_a, cam_b = (list_files(require_dir(os.path.join(self.dataset_dir, cam), name, self.LAYOUT), ".bmp", name)
                        for cam in ("cam_a", "cam_b"))
        if len(cam_a) != len(cam_b):
            raise DatasetFormatError(f"{name}: cam_a/ holds {len(cam_a)} images and cam_b/ {len(cam_b)} in "
                                     f"'{self.dataset_dir}'; each folder needs one image per person, paired by "
                                     f"sorted name")
        # Beside VIPeR/ in torchreid's viper/ folder; inside it when VIPeR/ lies at the root.
        parent = os.path.dirname(self.dataset_dir)
        home = self.dataset_dir if os.path.normpath(parent) == os.path.normpath(root) else parent
        self.split_path = os.path.join(home, SPLIT_FILE_NAME)
        draw, b_is_query = pick_id_split(self.split_path, name, range(len(cam_a)), split_id, two_way=True)
        train = [(cams[i], label, camid) for label, i in enumerate(draw["train"])
                 for camid, cams in enumerate((cam_a, cam_b))]
        test_a = [(cam_a[i], label, 0) for label, i in enumerate(draw["test"])]
        test_b = [(cam_b[i], label, 1) for label, i in enumerate(draw["test"])]
        query, gallery = (test_b, test_a) if b_is_query else (test_a, test_b)
        super().__init__(train, query, gallery, name, combineall=combineall, distractor_pids=(),
                         source=self.dataset_dir)


def _draw_ilids_splits(names_by_pid: Dict[int, List[str]], rng: random.Random, num_splits: int = 10) -> List[Split]:
    """torchreid's QMUL iLIDS protocol: half the people (rounded down) train with all their
    images; each test person gives two random images, one query and one gallery."""
    splits = []
    for train_pids, test_pids in shuffled_halves(names_by_pid, rng, num_splits):
        train = sorted(name for pid in train_pids for name in names_by_pid[pid])
        query, gallery = [], []
        for pid in sorted(test_pids):
            first, second = rng.sample(names_by_pid[pid], 2)
            query.append(first)
            gallery.append(second)
        splits.append({"train": train, "query": query, "gallery": gallery})
    return splits


@DATASET_REGISTRY.register()
class ilids(ImageDataset):  # noqa: N801 (torchreid's registered name)
    """QMUL iLIDS as torchreid evaluates it: 119 people / 476 images, 10 splits.

    ``ilids/i-LIDS_Pedestrian/Persons/<pid 4 digits><image 3 digits>.jpg``. The image
    number minus 1 serves as the camera (the set has no camera labels). Each seeded draw
    puts 59 people in train (all images) and 60 in test, each with one random query and
    one random gallery image. Test pids are the ids of the names. Not fast-reid's
    ``iLIDS`` (frames of iLIDS-VID).

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        split_id: DATASETS.SPLIT_ID (0..9).
    """

    HAS_SPLITS = True
    LAYOUT = "i-LIDS_Pedestrian/Persons/ with images named <pid 4 digits><image 3 digits>.jpg (e.g. 0001001.jpg)"
    NAME = re.compile(r"(\d{4})(\d{3})\D")
    RULE = "a name <pid 4 digits><image 3 digits>.jpg (e.g. 0001001.jpg)"

    def __init__(self, root: str = "datasets", combineall: bool = False, split_id: int = 0):
        name = self._locate(root)
        image_dir = require_dir(os.path.join(self.dataset_dir, "i-LIDS_Pedestrian", "Persons"), name, self.LAYOUT)
        parsed = {os.path.basename(path): (path, int(m.group(1)), int(m.group(2)) - 1)
                  for path, m in match_names(list_files(image_dir, ".jpg", name), self.NAME, name, self.RULE)}
        names_by_pid: Dict[int, List[str]] = defaultdict(list)
        for file_name, (_, pid, _) in parsed.items():
            names_by_pid[pid].append(file_name)
        lonely = sorted(pid for pid, names in names_by_pid.items() if len(names) < 2)
        if lonely:
            raise DatasetFormatError(f"{name}: person {lonely[0]:04d} has only one image in '{image_dir}'; every "
                                     f"person needs two or more (one query, one gallery)")
        self.split_path = os.path.join(self.dataset_dir, SPLIT_FILE_NAME)
        splits = load_or_draw_splits(self.split_path, name, lambda rng: _draw_ilids_splits(names_by_pid, rng),
                                     ("train", "query", "gallery"))
        split = splits[check_split_id(split_id, len(splits), self.split_path, name)]
        for key in ("train", "query", "gallery"):
            unknown = [n for n in split[key] if n not in parsed]
            if unknown:
                raise split_mismatch(self.split_path, name, f"its {key} list names '{unknown[0]}', which is not in "
                                                            f"'{image_dir}'")
        train, query, gallery = ([parsed[n] for n in split[key]] for key in ("train", "query", "gallery"))
        super().__init__(train, query, gallery, name, combineall=combineall, distractor_pids=(),
                         source=self.dataset_dir)


@DATASET_REGISTRY.register()
class prid(ImageDataset):  # noqa: N801 (torchreid's registered name)
    """PRID 2011 single-shot as torchreid evaluates it: 10 splits of people 1-200.

    ``prid2011/prid_2011/single_shot/cam_a/person_NNNN.png`` (385 people) and ``cam_b/``
    (749); people 1-200 appear in both. Each seeded draw trains on 100 of them (both
    images) and tests on the other 100: query = their cam_a image, gallery = their cam_b
    image plus the cam_b-only people 201-749 as distractors. camid 0 = cam_a, 1 = cam_b;
    test pids are the person numbers.

    Args:
        root: the data root.
        combineall: fold query + gallery into training (the distractors excluded).
        split_id: DATASETS.SPLIT_ID (0..9).
    """

    HAS_SPLITS = True
    LAYOUT = "prid_2011/single_shot/cam_a/ and cam_b/ with images named person_NNNN.png"
    NUM_PAIRED = 200  # people 1..200 are the same person in both cameras; higher numbers are not
    NAME = re.compile(r"person_(\d{4})\.png$")
    RULE = "a name person_NNNN.png (e.g. person_0001.png)"

    def __init__(self, root: str = "datasets", combineall: bool = False, split_id: int = 0):
        name = self._locate(root)
        shot_dir = os.path.join(self.dataset_dir, "prid_2011", "single_shot")
        cam_a, cam_b = ({int(m.group(1)): path for path, m in match_names(
            list_files(require_dir(os.path.join(shot_dir, cam), name, self.LAYOUT), ".png", name),
            self.NAME, name, self.RULE)} for cam in ("cam_a", "cam_b"))
        for pid in range(1, self.NUM_PAIRED + 1):
            for cam, images in (("cam_a", cam_a), ("cam_b", cam_b)):
                if pid not in images:
                    raise DatasetNotFoundError(f"{name}: missing '{os.path.join(shot_dir, cam)}/person_{pid:04d}.png' "
                                               f"(people 1-{self.NUM_PAIRED} need an image in cam_a/ and cam_b/); "
                                               f"restore the single_shot folder of the PRID 2011 release")
        paired = range(1, self.NUM_PAIRED + 1)
        self.split_path = os.path.join(self.dataset_dir, SPLIT_FILE_NAME)
        split, _ = pick_id_split(self.split_path, name, paired, split_id)
        train: List[Item] = [(images[pid], pid, camid) for pid in split["train"]
                             for camid, images in enumerate((cam_a, cam_b))]
        query = [(cam_a[pid], pid, 0) for pid in split["test"]]
        distractors = sorted(pid for pid in cam_b if pid > self.NUM_PAIRED)
        gallery = [(cam_b[pid], pid, 1) for pid in list(split["test"]) + distractors]
        super().__init__(train, query, gallery, name, combineall=combineall, distractor_pids=distractors,
                         source=self.dataset_dir)


def read_grid_partitions(mat_path: str, dataset: str) -> List[List[int]]:
    """The training ids of each partition in GRID's ``features_and_partitions.mat``.

    The variable ``trainIdxAll`` is a cell array of 1x1 structs; the third field of each
    lists the partition's training ids (125 of the 250 paired people in the release).

    Raises:
        MatFileError / DatasetFormatError: the file cannot be read or holds no such variable.
    """
    cells = read_mat(mat_path).get("trainIdxAll")
    try:
        partitions = [[int(v) for v in cell.flat[0][2].flat] for cell in cells.flat]  # a struct's 3rd field
    except (AttributeError, IndexError, TypeError, ValueError):
        partitions = []
    if not partitions:
        raise DatasetFormatError(f"{dataset}: '{mat_path}' holds no trainIdxAll partitions (a cell array of structs "
                                 f"whose third field lists training ids); restore features_and_partitions.mat from "
                                 f"the GRID release")
    return partitions


@DATASET_REGISTRY.register()
class grid(ImageDataset):  # noqa: N801 (torchreid's registered name)
    """GRID as torchreid evaluates it: the release's 10 partitions (SPLIT_ID 0..9).

    ``grid/underground_reid/probe/`` and ``gallery/`` with ``<pid>_<camera 1-8>_....jpeg``
    images, plus ``features_and_partitions.mat``. The partition's 125 training people train
    with their probe and gallery images; the other probe images are the queries and the
    other gallery images the gallery, where pid 0 (775 people seen only once) are
    distractors. camid = camera - 1; test pids are the name's number.

    Args:
        root: the data root.
        combineall: fold query + gallery into training (pid 0 excluded).
        split_id: DATASETS.SPLIT_ID.
    """

    HAS_SPLITS = True
    LAYOUT = ("underground_reid/ with probe/ and gallery/ of *.jpeg images named <pid>_<camera>_... and "
              "features_and_partitions.mat")
    NAME = re.compile(r"(\d+)_(\d+)_")
    RULE = "a name <pid>_<camera 1-8>_....jpeg (e.g. 0005_2_25100_229_94_99_249.jpeg)"

    def __init__(self, root: str = "datasets", combineall: bool = False, split_id: int = 0):
        name = self._locate(root)
        base = require_dir(os.path.join(self.dataset_dir, "underground_reid"), name, self.LAYOUT)
        probe, gallery_images = ([(path, int(m.group(1)), int(m.group(2)) - 1) for path, m in match_names(
            list_files(require_dir(os.path.join(base, folder), name, self.LAYOUT), ".jpeg", name),
            self.NAME, name, self.RULE)] for folder in ("probe", "gallery"))
        self.split_path = require_file(os.path.join(base, "features_and_partitions.mat"), name, self.LAYOUT)
        partitions = read_grid_partitions(self.split_path, name)
        train_ids = set(partitions[check_split_id(split_id, len(partitions), self.split_path, name)])
        train = [item for item in probe + gallery_images if item[1] in train_ids]
        query = [item for item in probe if item[1] not in train_ids]
        gallery = [item for item in gallery_images if item[1] not in train_ids]
        super().__init__(train, query, gallery, name, combineall=combineall, distractor_pids=(0,),
                         source=self.dataset_dir)
