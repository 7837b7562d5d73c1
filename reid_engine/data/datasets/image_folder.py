"""Your own data without code: a folder of identity sub-folders, or CSV / list files.

Under ``<data root>/<folder>/`` each split (``train``, ``query``, ``gallery``) is given
either by a list file ``<split>.csv`` (``path,id,camera`` rows) / ``<split>.txt``
(``path id camera``), or by a folder ``<split>/<identity>/<image>`` whose camera is read
from the image name (``..._c3_...`` / ``cam3``). A list file wins over a folder.
"""

import csv
import os
import re
from typing import Dict, List, Sequence, Tuple

from .audit import report_file_problem
from .bases import ImageDataset
from .paths import DatasetNotFoundError, is_hidden_or_system, list_images, require_listed_files, visible_images
from .registry import DATASET_REGISTRY

SPLITS = ("train", "query", "gallery")
JUNK_ID = "-1"
DISTRACTOR_ID = "0"
# A camera token: "c3" or "cam3" at the start of the name or after a non-alphanumeric.
CAMERA_IN_NAME = re.compile(r"(?:^|[^A-Za-z0-9])c(?:am)?(\d+)", re.IGNORECASE)
_LAYOUT = ("train/, query/, gallery/ folders of <identity>/<image> (camera in the name, "
           "e.g. 0001_c2_xx.jpg) or train.csv, query.csv, gallery.csv with path,id,camera rows")

RawItem = Tuple[str, str, str]  # (path, identity, camera) as written by the user


def read_split_list(list_path: str, dataset_dir: str, dataset: str) -> List[RawItem]:
    """Read a ``path,id,camera`` CSV (or whitespace-separated ``.txt``) list.

    A first row ``path,id,camera`` is a header and skipped; blank lines and lines starting
    with ``#`` are ignored, and so are rows naming a hidden or system file (``._x.jpg``,
    ``__MACOSX/...``, ``Thumbs.db``). Relative paths start at ``dataset_dir``.

    Args:
        list_path: the list file.
        dataset_dir: the folder relative paths start from.
        dataset: the dataset name (for errors).
    Returns:
        ``(path, identity, camera)`` strings in file order.
    Raises:
        DatasetFormatError: a row without three fields (while problems are collected, every
            such row is reported instead, see :mod:`.audit`).
        DatasetNotFoundError: a listed image is missing (likewise).
    """
    with open(list_path, encoding="utf-8", newline="") as f:
        if list_path.endswith(".csv"):
            rows = [[c.strip() for c in row] for row in csv.reader(f)]
        else:
            rows = [line.split() for line in f]
    items = []
    for lineno, row in enumerate(rows, 1):
        if not row or not any(row) or row[0].startswith("#"):
            continue
        if lineno == 1 and [c.lower() for c in row] == ["path", "id", "camera"]:
            continue
        if len(row) != 3 or not all(row):
            report_file_problem(dataset, f"{list_path}:{lineno}", f"3 fields path,id,camera, not {len(row)}",
                                fix="correct the line", error=f"{dataset}: line {lineno} of '{list_path}' has "
                                f"{len(row)} field(s), expected 3: path,id,camera")
            continue
        if any(is_hidden_or_system(part) for part in row[0].replace("\\", "/").split("/")):
            continue
        items.append((os.path.join(dataset_dir, row[0]), row[1], row[2]))
    exists = require_listed_files([p for p, _, _ in items], list_path, dataset, _LAYOUT)
    return [item for item, ok in zip(items, exists) if ok]


def read_identity_folders(split_dir: str, dataset: str) -> List[RawItem]:
    """Read ``<split_dir>/<identity>/<image>``; the camera comes from the image name.

    Args:
        split_dir: the split folder.
        dataset: the dataset name (for errors).
    Returns:
        ``(path, identity, camera)`` strings, sorted by identity then name.
    Raises:
        DatasetFormatError: an image outside an identity folder, or a name without camera
            (while problems are collected, every such file is reported instead).
    """
    strays, identities = visible_images(split_dir)  # one listing of the split folder
    for path in (os.path.join(split_dir, name) for name in strays):
        report_file_problem(dataset, path, "an image inside an identity sub-folder", error=(
            f"{dataset}: image '{path}' is not inside an identity sub-folder; put each identity's images in "
            f"{split_dir}/<identity>/"))
    items = []
    for identity in identities:
        for path in list_images(os.path.join(split_dir, identity)):
            match = CAMERA_IN_NAME.search(os.path.basename(path))
            if match is None:
                report_file_problem(dataset, path, "a camera in the name, e.g. 0001_c2_xx.jpg (camera 2)", error=(
                    f"{dataset}: no camera in image name '{path}'; name images like 0001_c2_xx.jpg (camera 2) or "
                    f"give cameras in a {os.path.basename(split_dir)}.csv list (path,id,camera)"))
                continue
            items.append((path, identity, match.group(1)))
    return items


def _label_table(values: Sequence[str], reserved: Dict[str, int]) -> Dict[str, int]:
    """Map user labels to ints: integer labels keep their value, names get 1, 2, ... sorted.

    ``reserved`` labels keep their fixed values whichever scheme is used.
    """
    free = sorted(set(values) - set(reserved))
    if all(v.lstrip("-").isdigit() for v in free):
        return {**{v: int(v) for v in free}, **reserved}
    start = max(reserved.values(), default=-1) + 1
    return {**{v: start + i for i, v in enumerate(free)}, **reserved}


def _camera_table(values: Sequence[str]) -> Dict[str, int]:
    """Map camera labels to 0..C-1 in sorted order (numeric when all are integers)."""
    labels = sorted(set(values))
    if all(v.isdigit() for v in labels):
        labels.sort(key=int)
    return {v: i for i, v in enumerate(labels)}


@DATASET_REGISTRY.register()
class ImageFolderReID(ImageDataset):
    """A user dataset under ``<data root>/<folder>/`` (see the module docstring).

    Select it from the config with ``DATASETS.NAMES ("ImageFolder:<folder>",)``; an
    absolute ``<folder>`` is used as it is. Identity ``-1`` is junk (skipped) and ``0`` a
    distractor (kept in the gallery, never trained on); integer identities keep their value,
    other names are numbered 1, 2, ... in sorted order consistently over the three splits.
    Cameras are numbered 0..C-1 in sorted order over the three splits.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        folder: the dataset folder, relative to the root (or absolute).
    """

    NAME_ARGUMENT = "folder"  # "ImageFolder:<value>" passes <value> as this keyword

    def __init__(self, root: str = "datasets", combineall: bool = False, folder: str = ""):
        if not folder:
            raise ValueError("ImageFolderReID needs a folder: name it 'ImageFolder:<folder>' in "
                             "DATASETS.NAMES / DATASETS.TESTS")
        name = f"ImageFolder:{folder}"
        self.dataset_dir = os.path.join(root, folder)
        if not os.path.isdir(self.dataset_dir):
            raise DatasetNotFoundError(
                f"{name}: folder '{self.dataset_dir}' not found under the data root '{root}'; "
                f"it must contain {_LAYOUT} (or set DATASETS.ROOT / $REID_DATASETS)")
        raw = {split: self._read_split(split, name) for split in SPLITS}
        everything = [it for items in raw.values() for it in items]
        ids = _label_table([i for _, i, _ in everything if i != JUNK_ID], {DISTRACTOR_ID: 0})
        cams = _camera_table([c for _, _, c in everything])
        splits = {split: [(p, ids[i], cams[c]) for p, i, c in items if i != JUNK_ID]
                  for split, items in raw.items()}
        super().__init__(splits["train"], splits["query"], splits["gallery"], name,
                         combineall=combineall, distractor_pids=(0,), source=self.dataset_dir)

    def _read_split(self, split: str, name: str) -> List[RawItem]:
        """Read one split from its list file if present, else from its identity folders."""
        for ext in (".csv", ".txt"):
            list_path = os.path.join(self.dataset_dir, split + ext)
            if os.path.isfile(list_path):
                return read_split_list(list_path, self.dataset_dir, name)
        split_dir = os.path.join(self.dataset_dir, split)
        if os.path.isdir(split_dir):
            return read_identity_folders(split_dir, name)
        raise DatasetNotFoundError(
            f"{name}: neither '{split}.csv' nor a '{split}/' folder in '{self.dataset_dir}'; "
            f"it must contain {_LAYOUT}")
