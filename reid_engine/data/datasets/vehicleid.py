"""VehicleID (Liu et al., CVPR 2016) with its small / medium / large test lists."""

import os
import random
from collections import defaultdict
from typing import Dict, List, Tuple

from .bases import ImageDataset, Item
from .paths import find_dataset_dir, read_name_id_list, require_dir, require_file, require_listed_files
from .registry import DATASET_REGISTRY

_LAYOUT = ("image/*.jpg and train_test_split/ with train_list.txt and "
           "test_list_800.txt / test_list_1600.txt / test_list_2400.txt")
TEST_SIZES = (800, 1600, 2400)
GALLERY_SEED = 0  # the fixed seed of the one-gallery-image-per-vehicle draw


def read_vehicleid_list(list_path: str, image_dir: str) -> List[Tuple[str, int]]:
    """Read ``imagename vid`` lines into ``(image_path, vid)`` pairs (``.jpg`` appended)."""
    pairs = [(os.path.join(image_dir, name + ".jpg"), vid)
             for name, vid in read_name_id_list(list_path, "VehicleID", "imagename vid")]
    require_listed_files([p for p, _ in pairs], list_path, "VehicleID", _LAYOUT)
    return pairs


def split_query_gallery(pairs: List[Tuple[str, int]], seed: int = GALLERY_SEED
                        ) -> Tuple[List[Item], List[Item]]:
    """The VehicleID test protocol: per vehicle, one random image is the gallery, the rest query.

    Each image of a vehicle gets its own pseudo camera (gallery 0, queries 1, 2, ...) so
    the same-id-same-camera rule of the ranking protocol never drops the gallery match.

    Args:
        pairs: ``(image_path, vid)`` of the test list.
        seed: the seed of the gallery draw (fixed so results are comparable).
    Returns:
        ``(query, gallery)`` item lists.
    """
    by_vid: Dict[int, List[str]] = defaultdict(list)
    for path, vid in pairs:
        by_vid[vid].append(path)
    rng = random.Random(seed)
    query, gallery = [], []
    for vid in sorted(by_vid):
        paths = by_vid[vid]
        pick = rng.randrange(len(paths))
        gallery.append((paths[pick], vid, 0))
        rest = paths[:pick] + paths[pick + 1:]
        query.extend((path, vid, cam) for cam, path in enumerate(rest, 1))
    return query, gallery


@DATASET_REGISTRY.register()
class VehicleID(ImageDataset):
    """VehicleID: folder ``VehicleID_V1.0/`` with ``image/`` and ``train_test_split/``.

    Training images come from ``train_list.txt`` (all with camid 0: the set has no camera
    labels); the test set from ``test_list_<test_size>.txt`` split by
    :func:`split_query_gallery`.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        test_size: 800 (small, default), 1600 (medium) or 2400 (large).
    """

    TEST_SIZE = 800

    def __init__(self, root: str = "datasets", combineall: bool = False,
                 test_size: int = 0):
        test_size = test_size or self.TEST_SIZE
        if test_size not in TEST_SIZES:
            raise ValueError(f"VehicleID: test_size must be one of {TEST_SIZES}, got {test_size}")
        name = type(self).__name__
        self.dataset_dir = find_dataset_dir(root, name, ("VehicleID_V1.0",), _LAYOUT)
        image_dir = require_dir(os.path.join(self.dataset_dir, "image"), name, _LAYOUT)
        split_dir = require_dir(os.path.join(self.dataset_dir, "train_test_split"), name, _LAYOUT)
        train_list = require_file(os.path.join(split_dir, "train_list.txt"), name, _LAYOUT)
        test_list = require_file(os.path.join(split_dir, f"test_list_{test_size}.txt"), name,
                                 _LAYOUT)
        train = [(path, vid, 0) for path, vid in read_vehicleid_list(train_list, image_dir)]
        query, gallery = split_query_gallery(read_vehicleid_list(test_list, image_dir))
        super().__init__(train, query, gallery, name, combineall=combineall,
                         distractor_pids=(), source=self.dataset_dir)


@DATASET_REGISTRY.register()
class SmallVehicleID(VehicleID):
    """VehicleID with the 800-vehicle test list."""

    TEST_SIZE = 800


@DATASET_REGISTRY.register()
class MediumVehicleID(VehicleID):
    """VehicleID with the 1,600-vehicle test list."""

    TEST_SIZE = 1600


@DATASET_REGISTRY.register()
class LargeVehicleID(VehicleID):
    """VehicleID with the 2,400-vehicle test list."""

    TEST_SIZE = 2400
