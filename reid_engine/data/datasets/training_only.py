"""fast-reid's training-only person sets (used for domain generalisation): no query, no gallery.

Each class reads ids and cameras as text from its folder layout, exactly where fast-reid
1.4 reads them, and numbers them in sorted text order (:func:`.layout.number_raw_items`).
The registered names and the folders under the data root are fast-reid's (plus
torchreid's ``cuhksysu``, its training-only CUHK-SYSU). Listing one of these sets in
DATASETS.TESTS is a config error (they have nothing to evaluate). Their base class and the
readers they share are in :mod:`.training_only_base` (re-exported here).
"""

import os
import re
from typing import List

from .audit import report_file_problem
from .layout import RawItem, list_files, name_fields, subfolders, walk_files
from .paths import list_lines, require_file, require_one_dir
from .registry import DATASET_REGISTRY
from .training_only_base import (
    IdentityFoldersSet,
    NameFieldsSet,
    TrainingOnlyDataset,
    constant_camera,
    read_identity_folders,
    read_name_fields,
)

__all__ = ["TrainingOnlyDataset", "NameFieldsSet", "IdentityFoldersSet", "TRAINING_ONLY_SETS"]


@DATASET_REGISTRY.register()
class cuhkSYSU(TrainingOnlyDataset):  # noqa: N801 (fast-reid's registered name)
    """CUHK-SYSU person crops: 11,934 ids / 34,574 images, one pseudo camera.

    ``cuhk_sysu/cropped_images/p<pid>_s<scene>_<k>.jpg``; the id is the integer after
    ``p`` (so its zero padding is dropped, as in fast-reid).
    """

    LAYOUT = "cropped_images/ with images named p<pid>_s<scene>_<k>.jpg (e.g. p11422_s16929_1.jpg)"
    NAME = re.compile(r"p(-?\d+)_s\d")

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        items = []
        for path in list_files(self.require_dir("cropped_images"), ".jpg", name):
            match = self.NAME.search(os.path.basename(path))
            if match is None:
                report_file_problem(name, path, "a name p<pid>_s<scene>_<k>.jpg (e.g. p11422_s16929_1.jpg)")
                continue
            items.append((path, str(int(match.group(1))), "0"))
        return items


@DATASET_REGISTRY.register()
class AirportALERT(TrainingOnlyDataset):
    """Airport ALERT: 9,651 ids / 30,243 images / 6 cameras (ids 11001 and up only).

    ``AirportALERT/filepath.txt`` lists ``<camera>\\<pid>\\<file>`` paths (Windows
    separators; ``/`` is accepted too) relative to the folder. As in fast-reid only ids
    >= 11001 are read.
    """

    LAYOUT = "filepath.txt listing <camera>\\<pid>\\<file> image paths relative to the folder"
    MIN_PID = 11001  # fast-reid keeps pid >= 11001 (its upper bound of 401999 is commented out)
    LINE_RULE = "a line <camera>\\<pid>\\<file> with an integer pid"

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        list_path = require_file(os.path.join(dataset_dir, "filepath.txt"), name, self.LAYOUT)
        items = []
        for lineno, line in list_lines(list_path):
            parts = [p for p in re.split(r"[\\/]", line) if p]
            if not parts:
                continue
            if len(parts) < 3 or not parts[1].isdigit():
                report_file_problem(name, f"{list_path}:{lineno}", self.LINE_RULE, fix="correct the line")
                continue
            if int(parts[1]) < self.MIN_PID:
                continue
            path = os.path.join(dataset_dir, *parts)
            if not os.path.isfile(path):
                report_file_problem(name, path, f"an image listed on line {lineno} of {list_path}",
                                    fix="restore the file or remove its line")
                continue
            items.append((path, parts[1], parts[0]))
        return items


@DATASET_REGISTRY.register()
class iLIDS(IdentityFoldersSet):  # noqa: N801 (fast-reid's registered name)
    """fast-reid's iLIDS (frames of iLIDS-VID by person): 300 ids / 4,515 images / 2 cameras.

    ``iLIDS/<pid>/<camera>_....png``, e.g. ``iLIDS/person001/cam1_person001_00317.png``.
    Not QMUL iLIDS: that one is torchreid's ``ilids``.
    """

    LAYOUT = "<pid>/ sub-folders of <camera>_*.png images (e.g. person001/cam1_person001_00317.png)"
    EXTENSION = ".png"
    CAMERA = ("_", 0)
    RULE = "a name <camera>_....png"


@DATASET_REGISTRY.register()
class PKU(NameFieldsSet):
    """PKU-Reid: 114 ids / 1,824 images / 2 cameras; ``PKUv1a_128x48/<pid>_<camera>_....png``."""

    LAYOUT = "*.png images named <pid>_<camera>_..."
    EXTENSION = ".png"
    RULE = "a name <pid>_<camera>_....png"


@DATASET_REGISTRY.register()
class PRAI(NameFieldsSet):
    """PRAI-1581 (aerial): 1,580 ids / 39,481 images; ``PRAI-1581/images/<pid>_<camera>_....jpg``."""

    LAYOUT = "images/ with *.jpg images named <pid>_<camera>_..."
    IMAGES = "images"
    RULE = "a name <pid>_<camera>_....jpg"


@DATASET_REGISTRY.register()
class PRID(TrainingOnlyDataset):
    """fast-reid's PRID (a derived ``slim_train`` folder of PRID 2011; sizes unknown).

    Every ``*.png`` below ``prid_2011/slim_train/``; the id is the parent folder name after
    its first '_' (``person_0001`` gives ``0001``, whichever camera), the camera the file
    name before its first '_' (the whole name if it has none, as in fast-reid).
    torchreid's single-shot benchmark is ``prid``.
    """

    LAYOUT = "slim_train/ with *.png images in person_<pid>/ folders"

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        items = []
        for path in walk_files(self.require_dir("slim_train"), ".png", name):
            folder_fields = os.path.basename(os.path.dirname(path)).split("_")
            if len(folder_fields) < 2:
                report_file_problem(name, path, "an image inside a person_<pid>/ folder")
                continue
            items.append((path, folder_fields[1], os.path.basename(path).split("_")[0]))
        return items


@DATASET_REGISTRY.register()
class GRID(NameFieldsSet):
    """GRID as fast-reid trains on it: 1,025 ids / 1,275 images / 8 cameras.

    ``underground_reid/images/<pid>_<camera>_....jpeg`` (the release's ``probe/`` and
    ``gallery/`` merged). pid ``0000`` (the unpaired people) stays one identity, as in
    fast-reid. torchreid's benchmark with the official partitions is ``grid``.
    """

    LAYOUT = "images/ with *.jpeg images named <pid>_<camera>_... (probe/ and gallery/ merged)"
    IMAGES = "images"
    EXTENSION = ".jpeg"
    RULE = "a name <pid>_<camera>_....jpeg (e.g. 0005_2_25100_229_94_99_249.jpeg)"


@DATASET_REGISTRY.register()
class SAIVT(IdentityFoldersSet):
    """SAIVT-SoftBio crops: 152 ids / 7,150 images / 8 cameras.

    ``SAIVT-SoftBio/cropped_images/<pid>/*.jpeg``; the camera is the third '-' field of the
    file name.
    """

    LAYOUT = "cropped_images/<pid>/ folders of *.jpeg images whose third '-' field is the camera"
    IMAGES = "cropped_images"
    EXTENSION = ".jpeg"
    CAMERA = ("-", 2)
    RULE = "a name <a>-<b>-<camera>....jpeg (three '-' fields)"


@DATASET_REGISTRY.register()
class SenseReID(TrainingOnlyDataset):
    """SenseReID, both folders as training data: 1,718 ids / 3,338 images / 2 cameras.

    ``SenseReID/test_gallery/<pid>_<camera>.jpg`` and ``SenseReID/test_prob/`` (fast-reid's
    spelling; the release's ``test_probe/``, which torchreid reads, is accepted too).
    """

    LAYOUT = "test_gallery/ and test_prob/ with images named <pid>_<camera>.jpg"
    SUBFOLDERS = (("test_gallery",), ("test_prob", "test_probe"))

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        items = []
        for spellings in self.SUBFOLDERS:
            paths = list_files(require_one_dir(dataset_dir, spellings, name, self.LAYOUT), ".jpg", name)
            for path, pid, camera in read_name_fields(paths, name, "_", 0, 1, "a name <pid>_<camera>.jpg"):
                items.append((path, pid, camera.split(".")[0]))
        return items


@DATASET_REGISTRY.register()
class SYSU_mm(TrainingOnlyDataset):  # noqa: N801 (fast-reid's registered name)
    """SYSU-MM01, RGB cameras only: 510 ids / 30,071 images / 4 cameras.

    ``SYSU-MM01/cam{1,2,4,5}/<pid>/*.jpg`` (cam3 and cam6 are infrared and not read); the
    same id folder in two cameras is the same person.
    """

    LAYOUT = "cam1/, cam2/, cam4/, cam5/ with <pid>/ folders of *.jpg images"
    CAMERAS = ("cam1", "cam2", "cam4", "cam5")

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        items = []
        for camera in self.CAMERAS:
            items += read_identity_folders(self.require_dir(camera), ".jpg", name, constant_camera(camera))
        return items


@DATASET_REGISTRY.register()
class Thermalworld(IdentityFoldersSet):
    """Thermalworld (RGB part): 409 ids / 8,103 images; ``thermalworld_rgb/<pid>/*.jpg``."""

    LAYOUT = "<pid>/ folders of *.jpg images"


@DATASET_REGISTRY.register()
class PeS3D(IdentityFoldersSet):
    """3DPeS: 193 ids / 1,012 images; ``3DPeS/<pid>/*.bmp``."""

    LAYOUT = "<pid>/ folders of *.bmp images"
    EXTENSION = ".bmp"


@DATASET_REGISTRY.register()
class CAVIARa(TrainingOnlyDataset):
    """CAVIAR4REID: 72 ids / 1,220 images; ``CAVIARa/*.jpg``, the id is the first 4 characters."""

    LAYOUT = "*.jpg images whose first 4 characters are the pid (e.g. 0001001.jpg)"

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        items = []
        for path in list_files(dataset_dir, ".jpg", name):
            stem = os.path.splitext(os.path.basename(path))[0]
            if len(stem) < 4:
                report_file_problem(name, path, "a name whose first 4 characters are the pid (e.g. 0001001.jpg)")
                continue
            items.append((path, stem[:4], "cam0"))
        return items


@DATASET_REGISTRY.register()
class VIPeR(TrainingOnlyDataset):
    """VIPeR as fast-reid trains on it: 632 ids / 1,264 images / 2 cameras.

    ``VIPeR/cam_a/<pid>_<angle>.bmp`` and ``VIPeR/cam_b/``; the same number in both folders
    is the same person. torchreid's benchmark with test splits is ``viper``.
    """

    LAYOUT = "cam_a/ and cam_b/ with images named <pid>_<angle>.bmp (e.g. cam_a/000_45.bmp)"

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        items = []
        for camera in ("cam_a", "cam_b"):
            paths = list_files(self.require_dir(camera), ".bmp", name)
            # fields 0 and 1 (pid, angle) must exist; the camera is the folder.
            items += [(path, pid, camera) for path, pid, _ in
                      read_name_fields(paths, name, "_", 0, 1, "a name <pid>_<angle>.bmp (e.g. 000_45.bmp)")]
        return items


@DATASET_REGISTRY.register()
class LPW(TrainingOnlyDataset):
    """LPW (reduced ``data_slim`` copy): 2,731 ids / 30,678 images / 4 cameras.

    ``pep_256x128/data_slim/scen{1,2,3}/<camera>/<pid>/*.jpg``. Ids restart in each scene,
    so the id is ``<scene>-<pid>``; the camera folder name is *not* qualified by the scene
    (``view1`` of every scene is one camera), as in fast-reid.
    """

    LAYOUT = "scen1/, scen2/, scen3/ with <camera>/<pid>/ folders of *.jpg images"
    SCENES = ("scen1", "scen2", "scen3")

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        items = []
        for scene in self.SCENES:
            scene_dir = self.require_dir(scene)
            for camera in subfolders(scene_dir, name, "inside <camera>/<pid>/ sub-folders"):
                items += [(path, f"{scene}-{pid}", camera) for path, pid, camera in
                          read_identity_folders(os.path.join(scene_dir, camera), ".jpg", name,
                                                constant_camera(camera))]
        return items


@DATASET_REGISTRY.register()
class Shinpuhkan(NameFieldsSet):
    """Shinpuhkan: 24 ids / 4,501 images / 8 cameras.

    Every ``*.jpg`` below ``shinpuhkan/``, named ``<pid>_<x>_<camera>_...``: the id is field
    0 and the camera field 2 of the name split on '_'.
    """

    LAYOUT = "*.jpg images (in any sub-folder) named <pid>_<x>_<camera>_..."
    RECURSIVE = True
    CAM_FIELD = 2
    RULE = "a name <pid>_<x>_<camera>_....jpg (three '_' fields)"


@DATASET_REGISTRY.register()
class WildTrackCrop(IdentityFoldersSet):
    """WILDTRACK person crops: 313 ids / 33,979 images / 7 cameras.

    ``Wildtrack_crop_dataset/crop/<pid>/<camera>_<frame>.png`` (e.g. ``02_00000135.png``).
    """

    LAYOUT = "crop/<pid>/ folders of images named <camera>_<frame>.png (e.g. 02_00000135.png)"
    IMAGES = "crop"
    EXTENSION = ".png"
    CAMERA = ("_", 0)
    RULE = "a name <camera>_<frame>.png"


@DATASET_REGISTRY.register()
class cuhksysu(TrainingOnlyDataset):  # noqa: N801 (torchreid's registered name)
    """torchreid's CUHK-SYSU crops: ``cuhksysu/cropped_images/*.jpg``, one pseudo camera.

    The id is the name text before the first '_' (``p11422`` for ``p11422_s16929_1.jpg``).
    torchreid fills query and gallery with a placeholder image; here they are empty and
    the set is refused in DATASETS.TESTS, like fast-reid's ``cuhkSYSU``.
    """

    LAYOUT = "cropped_images/ with images named <pid>_....jpg (e.g. p11422_s16929_1.jpg)"

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        items = []
        for path in list_files(self.require_dir("cropped_images"), ".jpg", name):
            fields = name_fields(path, "_", 2, name, "a name <pid>_....jpg (e.g. p11422_s16929_1.jpg)")
            if fields is not None:
                items.append((path, fields[0], "0"))
        return items


# fast-reid's sets of this module by registered name, for documentation and tests.
TRAINING_ONLY_SETS = {cls.__name__: cls for cls in (
    cuhkSYSU, AirportALERT, iLIDS, PKU, PRAI, PRID, GRID, SAIVT, SenseReID, SYSU_mm, Thermalworld,
    PeS3D, CAVIARa, VIPeR, LPW, Shinpuhkan, WildTrackCrop)}
