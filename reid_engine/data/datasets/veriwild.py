"""VERI-Wild (Lou et al., CVPR 2019) with its small / medium / large test sets, as fast-reid reads it."""

import os
from typing import Dict, List, Tuple

from .audit import report_file_problem
from .bases import Item
from .paths import list_lines
from .registry import DATASET_REGISTRY
from .sized_tests import SizedTestListDataset, sized_variants

__all__ = ["VeRiWild", "SmallVeRiWild", "MediumVeRiWild", "LargeVeRiWild", "read_vehicle_info",
           "read_veriwild_list"]

_LAYOUT = ("images/<vid>/<imgid>.jpg and train_test_split/ with train_list.txt, test_<size>.txt, "
           "test_<size>_query.txt (size 3000, 5000 or 10000) and vehicle_info.txt")
TEST_SIZES = (3000, 5000, 10000)


def read_vehicle_info(info_path: str, image_dir: str, dataset: str) -> Dict[str, Tuple[str, int]]:
    """Read ``vehicle_info.txt``: a header line, then ``<vid>/<imgid>;<camera>;...`` records.

    Only the first two fields are read (the others are time, model, type and colour).

    Args:
        info_path: the file.
        image_dir: the ``images/`` folder.
        dataset: the dataset name (for errors).
    Returns:
        ``{imgid: (image path, camera)}``; the camera is the integer as written (not shifted).
    """
    table = {}
    for lineno, line in list_lines(info_path, header=True):
        fields = line.split(";")
        if not fields[0]:
            continue
        key = fields[0].split("/")
        if len(fields) < 2 or len(key) != 2 or not fields[1].strip().isdigit():
            report_file_problem(dataset, f"{info_path}:{lineno}", "a record <vid>/<imgid>;<camera>;... with "
                                "an integer camera", fix="correct the line")
            continue
        table[key[1]] = (os.path.join(image_dir, key[0], key[1] + ".jpg"), int(fields[1]))
    return table


def read_veriwild_list(list_path: str, info: Dict[str, Tuple[str, int]], dataset: str) -> List[Item]:
    """Read a list of ``<vid>/<imgid>`` lines into ``(path, vid, camera)`` items (file order).

    The path and camera come from ``vehicle_info.txt`` (``info``), as in fast-reid.
    Malformed lines, image ids missing from ``info`` and missing image files are problems
    (:mod:`.audit`).
    """
    items = []
    for lineno, line in list_lines(list_path):
        parts = line.split("/")
        imgid = parts[-1].split(".")[0]
        where = f"{list_path}:{lineno}"
        if len(parts) != 2 or not parts[0].isdigit():
            report_file_problem(dataset, where, "a line <vid>/<imgid> (e.g. 00001/000001)", fix="correct the line")
        elif imgid not in info:
            report_file_problem(dataset, where, f"an image id of vehicle_info.txt (got '{imgid}')",
                                fix="correct the line or the info file")
        elif not os.path.isfile(info[imgid][0]):
            report_file_problem(dataset, info[imgid][0], f"an image (listed on line {lineno} of {list_path})",
                                fix="restore the image or remove its line")
        else:
            path, camera = info[imgid]
            items.append((path, int(parts[0]), camera))
    return items


@DATASET_REGISTRY.register()
class VeRiWild(SizedTestListDataset):
    """VERI-Wild: 30,671 train vehicles / 277,797 images; the test set of ``TEST_SIZE`` vehicles.

    Folder ``VERI-Wild/`` with ``images/<vid>/<imgid>.jpg`` and ``train_test_split/``. The
    vehicle id is the first part of each list line; the camera comes from
    ``vehicle_info.txt`` as written (fast-reid does not shift it). Test sizes: 3,000 vehicles
    / 41,861 images (small), 5,000 / 69,389 (medium), 10,000 / 138,517 (large and the plain
    ``VeRiWild``). No junk or distractor ids.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        test_size: 3000, 5000 or 10000 (default: the class's ``TEST_SIZE``).
    """

    IMAGE_FOLDER = "images"
    LAYOUT = _LAYOUT
    TEST_SIZES = TEST_SIZES
    TEST_SIZE = 10000

    def read_splits(self, test_size: int) -> Tuple[List[Item], List[Item], List[Item]]:
        """Train, query and gallery from their list files, paths and cameras from ``vehicle_info.txt``."""
        name = type(self).__name__
        lists = [self.list_file(f) for f in ("train_list.txt", f"test_{test_size}_query.txt", f"test_{test_size}.txt")]
        info = read_vehicle_info(self.list_file("vehicle_info.txt"), self.image_dir, name)
        train, query, gallery = (read_veriwild_list(path, info, name) for path in lists)
        return train, query, gallery


SmallVeRiWild, MediumVeRiWild, LargeVeRiWild = sized_variants(VeRiWild, (3000, 5000, 10000), "vehicle")
