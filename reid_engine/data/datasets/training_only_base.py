"""The base of fast-reid's training-only sets (:mod:`.training_only`) and the two readers
most of them share: identity sub-folders, and identity / camera fields of the file names."""

import os
from typing import Callable, List, Optional, Tuple

from .bases import ImageDataset
from .folders import dataset_folders
from .layout import RawItem, list_files, name_fields, number_raw_items, subfolders, walk_files
from .paths import require_dir

__all__ = ["TrainingOnlyDataset", "NameFieldsSet", "IdentityFoldersSet", "read_identity_folders", "read_name_fields",
           "camera_field", "constant_camera"]


class TrainingOnlyDataset(ImageDataset):
    """Base of the sets that only have training images.

    Subclasses set :attr:`LAYOUT` (what the folder holds, for errors) and implement
    :meth:`read`. The folder is found by the accepted names of :mod:`.folders`;
    :attr:`FOLDER` is the first of them (fast-reid's).

    Args:
        root: the data root.
        combineall: accepted for a uniform interface; there is no test data to fold in.
    """

    TRAIN_ONLY = True
    FOLDER = ""
    LAYOUT = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.FOLDER = dataset_folders(cls, (cls.FOLDER,))[0]

    def __init__(self, root: str = "datasets", combineall: bool = False):
        name = self._locate(root)
        train = number_raw_items(self.read(self.dataset_dir, name))
        super().__init__(train, [], [], name, combineall=combineall, distractor_pids=(),
                         source=self.dataset_dir)

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        """Return ``(path, identity text, camera text)`` of every training image."""
        raise NotImplementedError

    def require_dir(self, *parts: str) -> str:
        """``dataset_dir/<parts>`` if it is a folder, else a one-line error naming the layout."""
        return require_dir(os.path.join(self.dataset_dir, *parts), type(self).__name__, self.LAYOUT)


def read_identity_folders(folder: str, extension: str, dataset: str,
                          camera_of: Callable[[str], Optional[str]]) -> List[RawItem]:
    """Read ``folder/<identity>/*<extension>``; the identity is the sub-folder name.

    Args:
        folder: the folder of identity sub-folders.
        extension: the image extension read (e.g. ``".jpg"``).
        dataset: the dataset name (for errors).
        camera_of: the camera text of an image path, or None to skip the image (the
            function has reported why).
    Returns:
        ``(path, identity, camera)`` sorted by identity, then name.
    """
    items = []
    for identity in subfolders(folder, dataset, "inside <identity>/ sub-folders"):
        for path in list_files(os.path.join(folder, identity), extension, dataset):
            camera = camera_of(path)
            if camera is not None:
                items.append((path, identity, camera))
    return items


def read_name_fields(paths: List[str], dataset: str, separator: str, pid_field: int, cam_field: int,
                     rule: str) -> List[RawItem]:
    """Take the identity and camera texts from fields of each file name.

    Args:
        paths: image paths.
        dataset: the dataset name (for errors).
        separator: the field separator.
        pid_field, cam_field: field indices (the camera field may keep the extension, as
            in fast-reid, when it is the last one).
        rule: the expected name, for errors.
    Returns:
        ``(path, identity, camera)``, names breaking the rule left out (or raised).
    """
    needed = max(pid_field, cam_field) + 1
    items = []
    for path in paths:
        fields = name_fields(path, separator, needed, dataset, rule)
        if fields is not None:
            items.append((path, fields[pid_field], fields[cam_field]))
    return items


def camera_field(dataset: str, rule: str, separator: str, field: int) -> Callable[[str], Optional[str]]:
    """A ``camera_of`` for :func:`read_identity_folders`: field ``field`` of the file name split on ``separator``.

    The name needs at least ``max(field + 1, 2)`` fields (a name without the separator
    breaks the rule even when field 0 is the camera).
    """
    def camera_of(path: str) -> Optional[str]:
        fields = name_fields(path, separator, max(field + 1, 2), dataset, rule)
        return None if fields is None else fields[field]
    return camera_of


def constant_camera(text: str) -> Callable[[str], str]:
    """A ``camera_of`` for sets without camera labels: every image gets ``text``."""
    return lambda path: text


class NameFieldsSet(TrainingOnlyDataset):
    """Sets of image files whose name gives the id (field 0) and the camera (a later field), split on '_'.

    Subclasses set :attr:`IMAGES`, :attr:`EXTENSION`, :attr:`RECURSIVE`, :attr:`CAM_FIELD`
    and :attr:`RULE` (the expected name, for errors).
    """

    IMAGES = ""  # the sub-folder holding the images ("": the dataset folder itself)
    EXTENSION = ".jpg"
    RECURSIVE = False  # every image below IMAGES, not only those directly inside
    CAM_FIELD = 1
    RULE = ""

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        folder = self.require_dir(self.IMAGES) if self.IMAGES else dataset_dir
        paths = (walk_files if self.RECURSIVE else list_files)(folder, self.EXTENSION, name)
        return read_name_fields(paths, name, "_", 0, self.CAM_FIELD, self.RULE)


class IdentityFoldersSet(TrainingOnlyDataset):
    """Sets of ``<IMAGES>/<pid>/*<EXTENSION>`` folders; the camera is a field of the file name, or one pseudo camera.

    Subclasses set :attr:`IMAGES`, :attr:`EXTENSION`, :attr:`CAMERA` and :attr:`RULE`.
    """

    IMAGES = ""  # the sub-folder holding the identity folders ("": the dataset folder itself)
    EXTENSION = ".jpg"
    CAMERA: Optional[Tuple[str, int]] = None  # (separator, field) of the camera in the name; None: all "cam0"
    RULE = ""

    def read(self, dataset_dir: str, name: str) -> List[RawItem]:
        folder = self.require_dir(self.IMAGES) if self.IMAGES else dataset_dir
        camera_of = constant_camera("cam0") if self.CAMERA is None else camera_field(name, self.RULE, *self.CAMERA)
        return read_identity_folders(folder, self.EXTENSION, name, camera_of)
