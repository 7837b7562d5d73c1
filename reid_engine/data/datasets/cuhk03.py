"""CUHK03 (Li et al., CVPR 2014): the CUHK03-NP folders, or the release's ``cuhk-03.mat`` as fast-reid and torchreid read it.

Two routes, tried in this order:

1. ``cuhk03-np/{detected,labeled}/``: Market-style folders of the new protocol (Zhong et al.,
   CVPR 2017), as distributed by the CUHK03-NP authors.
2. ``cuhk03/`` holding the release: ``cuhk03_release/cuhk-03.mat`` (MATLAB v7.3, read with
   h5py) and ``cuhk03_new_protocol_config_{detected,labeled}.mat`` (level 5, read with scipy).
   The crops of the chosen kind are written once as PNGs to ``cuhk03/images_{detected,labeled}/``
   (into a temporary folder renamed into place when complete), named like the peers name them:
   ``<camera pair 1-5>_<person, 3 digits>_<view 1|2>_<column 01-10>.png``. Folders a peer already
   extracted are used as they are. The new protocol comes from the config ``.mat`` files, the
   classic protocol (20 splits, ``DATASETS.SPLIT_ID`` 0..19) from ``testsets`` in ``cuhk-03.mat``.
"""

import datetime
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Dict, List, Tuple

import numpy as np

from ...config import ConfigError
from ...utils.errors import ReidUserError
from .bases import DatasetFormatError, ImageDataset, Item
from .market_style import MarketStyleDataset
from .matlab import MatFileError, open_mat_v73, read_mat
from .paths import DatasetNotFoundError, list_images, require_file, require_listed_files
from .registry import DATASET_REGISTRY
from .splits import check_split_id

logger = logging.getLogger(__name__)

__all__ = ["CUHK03", "CUHK03Labeled", "CUHK03Detected", "crop_name", "extract_crops", "CropExtractionError"]

RELEASE_DIR = "cuhk03"
RELEASE_MAT = os.path.join("cuhk03_release", "cuhk-03.mat")
NEW_PROTOCOL_MAT = "cuhk03_new_protocol_config_{}.mat"
IMAGES_DIR = "images_{}"
PROTOCOLS = ("new", "classic")
# Columns 1-5 of a person's row are the first camera of the pair (view 1), 6-10 the second.
VIEW_COLUMNS = 5
CROP_NAME = re.compile(r"^(\d+)_(\d+)_([12])_(\d+)\.png$")
# Seconds between two progress lines of the extraction.
PROGRESS_PERIOD = 10.0


class CropExtractionError(ReidUserError, OSError):
    """The extracted crops cannot be written (a read-only or full disk); nothing half-written is left."""


def crop_name(pair: int, person: int, column: int) -> str:
    """The file name of one crop, 0-based indices in: ``crop_name(0, 0, 5) == "1_001_2_06.png"``."""
    return f"{pair + 1}_{person + 1:03d}_{1 if column < VIEW_COLUMNS else 2}_{column + 1:02d}.png"


def _person_key(pair: int, person: int) -> int:
    """A pid unique across camera pairs, from the 1-based pair and person: pair 2 person 7 -> 2007."""
    return pair * 1000 + person


def _release_layout(labeled: bool) -> str:
    kind = "labeled" if labeled else "detected"
    return f"{RELEASE_MAT} and {NEW_PROTOCOL_MAT.format(kind)} (the CUHK03 release)"


def _refs(mat, dataset_name: str, path: str) -> np.ndarray:
    """The object references held by the variable ``dataset_name`` of a v7.3 file, in MATLAB (column) order."""
    try:
        refs = mat[dataset_name][()]
    except (KeyError, ValueError, TypeError, OSError):
        raise MatFileError(f"cannot read '{dataset_name}' from the MATLAB v7.3 file '{path}'; restore cuhk-03.mat "
                           f"from the CUHK03 release") from None
    return refs.T.reshape(-1) if refs.ndim == 2 else refs.reshape(-1)


def _deref(mat, ref, path: str) -> np.ndarray:
    """The array a reference points to, transposed back to MATLAB's axis order."""
    try:
        return mat[ref][()].T
    except (KeyError, ValueError, TypeError, OSError):
        raise MatFileError(f"cannot follow a cell reference in the MATLAB v7.3 file '{path}'; restore cuhk-03.mat "
                           f"from the CUHK03 release") from None


def _log_progress(kind: str, done: int, total: int, start: float) -> None:
    elapsed = time.monotonic() - start
    eta = datetime.timedelta(seconds=round(elapsed / max(done, 1) * (total - done)))
    logger.info("CUHK03: extracting the %s crops, %d / %d cells, ETA %s", kind, done, total, eta)


def _write_crops(mat, mat_path: str, kind: str, folder: str) -> int:
    """Write every non-empty cell of ``mat[kind]`` into ``folder``; return the number of images."""
    from PIL import Image

    grids = [_deref(mat, ref, mat_path) for ref in _refs(mat, kind, mat_path)]  # persons x 10 references each
    total = sum(grid.size for grid in grids)
    done = written = 0
    start = last = time.monotonic()
    for pair, grid in enumerate(grids):
        for person in range(grid.shape[0]):
            for column in range(grid.shape[1]):
                image = _deref(mat, grid[person, column], mat_path)
                done += 1
                if image.ndim != 3 or image.size == 0:  # an empty cell: no image in this column
                    continue
                Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(
                    os.path.join(folder, crop_name(pair, person, column)))
                written += 1
            if time.monotonic() - last >= PROGRESS_PERIOD:
                last = time.monotonic()
                _log_progress(kind, done, total, start)
    return written


def extract_crops(mat_path: str, kind: str, folder: str) -> str:
    """Write the ``kind`` crops of ``cuhk-03.mat`` as PNGs to ``folder``, once and atomically.

    The images go to a temporary folder beside ``folder`` that is renamed into place when
    complete, so an interrupted run leaves no half folder; an existing ``folder`` is kept.

    Args:
        mat_path: the release's ``cuhk-03.mat``.
        kind: ``"detected"`` or ``"labeled"``.
        folder: where the images go (``cuhk03/images_<kind>``).
    Returns:
        ``folder``.
    Raises:
        MatFileError: the file cannot be read.
        CropExtractionError: the images cannot be written.
    """
    if os.path.isdir(folder):
        return folder
    parent = os.path.dirname(os.path.abspath(folder))
    try:
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise CropExtractionError(f"CUHK03: cannot write the extracted crops to '{parent}' ({e.strerror}); make the "
                                  f"folder writable, or extract once on a writable copy of it") from None
    logger.info("CUHK03: extracting the %s crops of %s to %s (once)", kind, mat_path, folder)
    start = time.monotonic()
    try:
        with open_mat_v73(mat_path) as mat:
            count = _write_crops(mat, mat_path, kind, tmp)
        os.rename(tmp, folder)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.isdir(folder):  # another process finished the same extraction first
            return folder
        if isinstance(e, ReidUserError):
            raise
        raise CropExtractionError(f"CUHK03: cannot write the extracted crops to '{folder}' ({e}); free some space "
                                  f"or make the folder writable") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("CUHK03: wrote %d %s crops to %s in %.0f s", count, kind, folder, time.monotonic() - start)
    return folder


def _read_crops(folder: str) -> Dict[Tuple[int, int], List[Item]]:
    """The extracted crops by ``(pair, person)`` (1-based): items ``(path, pid, camid = view - 1)``."""
    people: Dict[Tuple[int, int], List[Item]] = {}
    for path in list_images(folder):
        match = CROP_NAME.match(os.path.basename(path))
        if match is None:
            continue  # not one of the extracted crops
        pair, person, view = (int(match.group(k)) for k in (1, 2, 3))
        people.setdefault((pair, person), []).append((path, _person_key(pair, person), view - 1))
    return people


def _classic_split(mat_path: str, people: Dict[Tuple[int, int], List[Item]], split_id: int,
                   dataset: str) -> Tuple[List[Item], List[Item]]:
    """``(train, test)`` of classic split ``split_id``: the test people of ``testsets``, the others train."""
    with open_mat_v73(mat_path) as mat:
        refs = _refs(mat, "testsets", mat_path)
        ref = refs[check_split_id(split_id, len(refs), mat_path, dataset)]
        pairs = _deref(mat, ref, mat_path)
    if pairs.shape[-1:] != (2,):
        raise MatFileError(f"{dataset}: classic split {split_id} of '{mat_path}' is not a list of (camera pair, person) "
                           f"rows; restore cuhk-03.mat from the CUHK03 release")
    test_people = {(int(a), int(b)) for a, b in pairs.reshape(-1, 2)}
    unknown = sorted(test_people - set(people))
    if unknown:
        raise DatasetFormatError(f"{dataset}: classic split {split_id} of '{mat_path}' names camera pair / person "
                                 f"{unknown[0]} without extracted images; delete the images_* folders to extract "
                                 f"them again")
    train = [item for key in sorted(people) if key not in test_people for item in people[key]]
    test = [item for key in sorted(test_people) for item in people[key]]
    return train, test


def _new_protocol_split(config_path: str, folder: str, dataset: str) -> Tuple[List[Item], List[Item], List[Item]]:
    """``(train, query, gallery)`` from a ``cuhk03_new_protocol_config_*.mat`` (1-based indices into filelist)."""
    config = read_mat(config_path)
    try:
        names = [str(np.asarray(cell).reshape(-1)[0]) for cell in config["filelist"].reshape(-1)]
        labels = config["labels"].reshape(-1).astype(int)
        indices = [config[key].reshape(-1).astype(int) - 1 for key in ("train_idx", "query_idx", "gallery_idx")]
        if min(i.min(initial=0) for i in indices) < 0 or max(i.max(initial=0) for i in indices) >= len(names):
            raise IndexError("an index outside filelist")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise MatFileError(f"{dataset}: '{config_path}' is not a CUHK03 new-protocol config (filelist, labels, "
                           f"train_idx, query_idx, gallery_idx; {e}); restore it from the CUHK03-NP release") from None
    splits = []
    for index in indices:
        items = []
        for i in index:
            match = CROP_NAME.match(names[i])
            if match is None:
                raise DatasetFormatError(f"{dataset}: '{config_path}' lists '{names[i]}', not a crop name like "
                                         f"'1_001_1_01.png'; restore it from the CUHK03-NP release")
            items.append((os.path.join(folder, names[i]), int(labels[i]), int(match.group(3)) - 1))
        splits.append(items)
    require_listed_files([p for items in splits for p, _, _ in items], config_path, dataset,
                         f"the images extracted from {RELEASE_MAT}")
    return splits[0], splits[1], splits[2]


@DATASET_REGISTRY.register()
class CUHK03(MarketStyleDataset):
    """CUHK03 with the hand-labelled boxes (default, as fast-reid's) or the detected ones; new protocol or classic splits.

    New protocol: 767 train ids / ~7,365 images; 1,400 queries; ~5,332 gallery. Classic: 20
    splits of 1,367 / 100 people, query = gallery = the test images. camid = view - 1 (0 or 1),
    as in fast-reid and torchreid. See the module docstring for the two folder routes.

    Config names: ``CUHK03`` (= ``CUHK03Labeled``) / ``CUHK03Detected`` (new protocol), and
    ``CUHK03:classic`` / ``CUHK03Detected:classic`` (classic split ``DATASETS.SPLIT_ID``).
    fast-reid's ``CUHK03`` reads the labelled boxes, so plain ``CUHK03`` does too (torchreid
    defaults to the detected ones: ``CUHK03Detected``).

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        labeled: use the hand-labelled boxes (default) instead of the detected ones.
        split_id: the classic split (0..19); the new protocol has one split and ignores it.
        protocol: ``"new"`` or ``"classic"``.
    Raises:
        DatasetNotFoundError: neither route's files exist (the message names both).
        ConfigError: an unknown protocol, or a classic split out of range.
    """

    NAME_EXAMPLE = "0001_c1_1.png"
    NAME_ARGUMENT = "protocol"  # "CUHK03:classic" passes protocol="classic"
    HAS_SPLITS = True

    def __init__(self, root: str = "datasets", combineall: bool = False, labeled: bool = True,
                 split_id: int = 0, protocol: str = "new"):
        name = type(self).__name__
        if protocol not in PROTOCOLS:
            raise ConfigError(f"DATASETS: unknown CUHK03 protocol '{protocol}' in '{name}:{protocol}'; use "
                              f"'{name}' (new protocol) or '{name}:classic' (the 20 classic splits)")
        self.labeled, self.protocol = labeled, protocol
        kind = "labeled" if labeled else "detected"
        np_dir = os.path.join("cuhk03-np", kind)
        self.DATASET_DIRS = (np_dir,)
        release = os.path.join(root, RELEASE_DIR)
        if protocol == "new" and os.path.isdir(os.path.join(root, np_dir)):
            if os.path.isdir(release):
                logger.info("%s: both '%s/' and '%s/' exist under %s; reading '%s/' (the CUHK03-NP folders come "
                            "first)", name, np_dir, RELEASE_DIR, root, np_dir)
            super().__init__(root, combineall=combineall)
            return
        if not os.path.isdir(release):
            wanted = (f"'{np_dir}/' (Market-style folders) or " if protocol == "new" else "") + f"'{RELEASE_DIR}/'"
            raise DatasetNotFoundError(
                f"{name} not found under the data root '{root}': expected {wanted} holding {_release_layout(labeled)}; "
                f"put it there or set DATASETS.ROOT (or $REID_DATASETS) to the folder that holds it")
        train, query, gallery = self._read_release(release, kind, split_id, name)
        # Not MarketStyleDataset's folders: the release route builds the lists itself.
        ImageDataset.__init__(self, train, query, gallery, name, combineall=combineall, distractor_pids=(),
                              source=release)

    def _read_release(self, release: str, kind: str, split_id: int, name: str):
        """``(train, query, gallery)`` of the release route, extracting the crops first if needed."""
        layout = _release_layout(self.labeled)
        mat_path = os.path.join(release, RELEASE_MAT)
        folder = os.path.join(release, IMAGES_DIR.format(kind))
        if not os.path.isdir(folder) or self.protocol == "classic":
            require_file(mat_path, name, layout)
        extract_crops(mat_path, kind, folder)
        if self.protocol == "new":
            config = require_file(os.path.join(release, NEW_PROTOCOL_MAT.format(kind)), name, layout)
            return _new_protocol_split(config, folder, name)
        train, test = _classic_split(mat_path, _read_crops(folder), split_id, name)
        return train, test, list(test)


@DATASET_REGISTRY.register()
class CUHK03Labeled(CUHK03):
    """CUHK03 with the hand-labelled boxes (``cuhk03-np/labeled/`` or ``cuhk03/images_labeled``)."""

    def __init__(self, root: str = "datasets", combineall: bool = False, split_id: int = 0, protocol: str = "new"):
        super().__init__(root, combineall=combineall, labeled=True, split_id=split_id, protocol=protocol)


@DATASET_REGISTRY.register()
class CUHK03Detected(CUHK03):
    """CUHK03 with the detected boxes (``cuhk03-np/detected/`` or ``cuhk03/images_detected``); torchreid's default."""

    def __init__(self, root: str = "datasets", combineall: bool = False, split_id: int = 0, protocol: str = "new"):
        super().__init__(root, combineall=combineall, labeled=False, split_id=split_id, protocol=protocol)
