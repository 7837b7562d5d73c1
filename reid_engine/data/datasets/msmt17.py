"""MSMT17 (Wei et al., CVPR 2018), versions V1 and V2."""

import os
from typing import List, Optional

from .audit import report_file_problem
from .bases import ImageDataset, Item
from .folders import dataset_folders
from .paths import find_dataset_dir, read_name_id_list, require_dir, require_file, require_listed_files
from .registry import DATASET_REGISTRY

# Image folders (train, test) per version; V2 releases may ship masked folders instead.
_IMAGE_DIRS = {
    "MSMT17_V1": (("train", "test"),),
    "MSMT17_V2": (("train", "test"), ("mask_train_v2", "mask_test_v2")),
}
_LAYOUT = ("train/ and test/ image folders plus list_train.txt, list_val.txt, "
           "list_query.txt, list_gallery.txt")


def camid_from_msmt_name(path: str) -> Optional[int]:
    """Camera of an MSMT17 image: field 2 of the file name split on '_', minus 1.

    Args:
        path: e.g. ``0000/0000_000_01_0303morning_0015_0.jpg`` (camera 1 -> camid 0).
    Returns:
        The 0-based camid, or None for a name without one while problems are collected.
    Raises:
        DatasetFormatError: the name has no integer field 2 (a normal load).
    """
    fields = os.path.basename(path).split("_")
    try:
        return int(fields[2]) - 1
    except (IndexError, ValueError):
        report_file_problem("MSMT17", path, "a name like 0000_000_01_0303morning_0015_0.jpg (camera = third '_' "
                            "field)", error=f"MSMT17: image name '{path}' has no camera field (expected names like "
                            f"0000_000_01_0303morning_0015_0.jpg, camera = third '_' field)")
        return None


def read_msmt_list(list_path: str, image_dir: str) -> List[Item]:
    """Read an MSMT17 list file of ``relative/path.jpg pid`` lines.

    Args:
        list_path: the list file.
        image_dir: the folder the relative paths start from.
    Returns:
        ``(path, pid, camid)`` items in file order (under ``reid-data check``, without the
        lines reported as problems).
    Raises:
        DatasetFormatError: a malformed line (with its number).
        DatasetNotFoundError: a listed image is missing (the wrong image folder).
    """
    items = [(os.path.join(image_dir, name), pid, camid_from_msmt_name(os.path.join(image_dir, name)))
             for name, pid in read_name_id_list(list_path, "MSMT17", "relative/path.jpg pid", allow_negative=True)]
    items = [item for item in items if item[2] is not None]
    exists = require_listed_files([p for p, _, _ in items], list_path, "MSMT17", _LAYOUT)
    return [item for item, ok in zip(items, exists) if ok]


@DATASET_REGISTRY.register()
class MSMT17(ImageDataset):
    """MSMT17: 1,041 train ids / 30,248 images (+2,373 val); 11,659 queries; 82,161 gallery.

    Folder ``MSMT17_V1/`` or ``MSMT17_V2/`` (also inside torchreid's ``msmt17/``) with ``train/``, ``test/`` and the four list
    files. Training uses ``list_train.txt``; ``list_val.txt`` (same ids) is added only with
    COMBINEALL. pid 0 is a real identity here (no distractors).

    Args:
        root: the data root.
        combineall: fold val, query and gallery into training.
        version: "V1" or "V2" to pick one when both exist (default: the first found, V1).
    """

    def __init__(self, root: str = "datasets", combineall: bool = False,
                 version: Optional[str] = None):
        if version and f"MSMT17_{version}" not in _IMAGE_DIRS:
            raise ValueError(f"MSMT17: version must be 'V1' or 'V2', got {version!r}")
        folders = [f for f in dataset_folders(MSMT17) if not version or os.path.basename(f) == f"MSMT17_{version}"]
        self.dataset_dir = find_dataset_dir(root, "MSMT17", folders, _LAYOUT)
        train_dir, test_dir = self._image_dirs()

        def read(list_name: str, image_dir: str) -> List[Item]:
            path = require_file(os.path.join(self.dataset_dir, list_name), "MSMT17", _LAYOUT)
            return read_msmt_list(path, image_dir)

        train = read("list_train.txt", train_dir)
        if combineall:
            train += read("list_val.txt", train_dir)
        query = read("list_query.txt", test_dir)
        gallery = read("list_gallery.txt", test_dir)
        super().__init__(train, query, gallery, "MSMT17", combineall=combineall,
                         distractor_pids=(), source=self.dataset_dir)

    def _image_dirs(self):
        """Return the (train, test) image folders of the version found."""
        options = _IMAGE_DIRS[os.path.basename(self.dataset_dir)]
        for train, test in options:
            train_dir = os.path.join(self.dataset_dir, train)
            test_dir = os.path.join(self.dataset_dir, test)
            if os.path.isdir(train_dir) and os.path.isdir(test_dir):
                return train_dir, test_dir
        # Neither pair exists: name the first missing folder of the standard layout.
        for folder in options[0]:
            require_dir(os.path.join(self.dataset_dir, folder), "MSMT17", _LAYOUT)
        raise AssertionError("unreachable: require_dir raised")
