"""VehicleID (Liu et al., CVPR 2016): fast-reid's 13,164-vehicle test set and the small / medium / large lists."""

import os
import random
from collections import defaultdict
from typing import Dict, List, Tuple

from .bases import Item
from .paths import read_name_id_list, require_listed_files
from .registry import DATASET_REGISTRY
from .sized_tests import SizedTestListDataset, sized_variants

__all__ = ["VehicleID", "SmallVehicleID", "MediumVehicleID", "LargeVehicleID", "read_vehicleid_list",
           "split_query_gallery"]

_LAYOUT = ("image/*.jpg and train_test_split/ with train_list.txt and test_list_13164.txt / "
           "test_list_800.txt / test_list_1600.txt / test_list_2400.txt")
TEST_SIZES = (800, 1600, 2400, 13164)
GALLERY_SEED = 0  # the fixed seed of the one-gallery-image-per-vehicle draw


def read_vehicleid_list(list_path: str, image_dir: str) -> List[Tuple[str, int]]:
    """Read ``imagename vid`` lines into ``(image_path, vid)`` pairs (``.jpg`` appended).

    Under ``reid-data check`` every malformed line and every missing image is reported
    (and left out); a normal load stops at the first.
    """
    pairs = [(os.path.join(image_dir, name + ".jpg"), vid)
             for name, vid in read_name_id_list(list_path, "VehicleID", "imagename vid")]
    exists = require_listed_files([p for p, _ in pairs], list_path, "VehicleID", _LAYOUT)
    return [pair for pair, ok in zip(pairs, exists) if ok]


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
class VehicleID(SizedTestListDataset):
    """VehicleID: folder ``VehicleID_V1.0/`` (or fast-reid's ``vehicleid/``) with ``image/`` and ``train_test_split/``.

    Training images come from ``train_list.txt`` (all with camid 0: the set has no camera
    labels); the test set from ``test_list_<test_size>.txt`` split by
    :func:`split_query_gallery`. The plain set tests on ``test_list_13164.txt``, as
    fast-reid's ``VehicleID`` does; ``SmallVehicleID`` / ``MediumVehicleID`` /
    ``LargeVehicleID`` on the 800 / 1,600 / 2,400-vehicle lists.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        test_size: 13164 (default), 800, 1600 or 2400.
    """

    IMAGE_FOLDER = "image"
    LAYOUT = _LAYOUT
    TEST_SIZES = TEST_SIZES
    TEST_SIZE = 13164

    def read_splits(self, test_size: int) -> Tuple[List[Item], List[Item], List[Item]]:
        """Train from ``train_list.txt``; query / gallery drawn from ``test_list_<test_size>.txt``."""
        train = [(path, vid, 0) for path, vid in read_vehicleid_list(self.list_file("train_list.txt"), self.image_dir)]
        query, gallery = split_query_gallery(
            read_vehicleid_list(self.list_file(f"test_list_{test_size}.txt"), self.image_dir))
        return train, query, gallery


SmallVehicleID, MediumVehicleID, LargeVehicleID = sized_variants(VehicleID, (800, 1600, 2400), "vehicle")
