"""Locating datasets on disk: the data root, dataset folders and image files."""

import os
from typing import List, Sequence

from ...utils.errors import ReidUserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")


class DatasetNotFoundError(ReidUserError, FileNotFoundError):
    """A dataset folder (or a file inside it) is missing; the message names the fix."""


def resolve_data_root(cfg_root: str) -> str:
    """Return the data root: ``cfg_root`` if set, else ``$REID_DATASETS``, else ``./datasets``.

    Args:
        cfg_root: the value of ``DATASETS.ROOT`` ("" means unset).
    Returns:
        The root folder path with ``~`` expanded (it need not exist yet).
    """
    root = cfg_root or os.environ.get("REID_DATASETS", "") or "./datasets"
    return os.path.expanduser(root)


def _root_hint() -> str:
    return "put it there or set DATASETS.ROOT (or $REID_DATASETS) to the folder that holds it"


def find_dataset_dir(root: str, dataset: str, candidates: Sequence[str], layout: str) -> str:
    """Return the first existing folder among ``root/<candidate>``.

    Args:
        root: the data root.
        dataset: the dataset name used in the error message.
        candidates: folder names (relative to the root) accepted for this dataset.
        layout: a short description of what the folder must contain (for the error).
    Returns:
        The path of the dataset folder.
    Raises:
        DatasetNotFoundError: none of the candidates exists (one line naming root, layout, fix).
    """
    for rel in candidates:
        path = os.path.join(root, rel)
        if os.path.isdir(path):
            return path
    names = " or ".join(f"'{c}/'" for c in candidates)
    raise DatasetNotFoundError(
        f"{dataset} not found under the data root '{root}': expected {names} containing "
        f"{layout}; {_root_hint()}"
    )


def require_dir(path: str, dataset: str, layout: str) -> str:
    """Return ``path`` if it is a folder, else raise a one-line :class:`DatasetNotFoundError`."""
    if not os.path.isdir(path):
        raise DatasetNotFoundError(
            f"{dataset}: missing folder '{path}' (the dataset folder must contain {layout}); "
            f"{_root_hint()}"
        )
    return path


def require_file(path: str, dataset: str, layout: str) -> str:
    """Return ``path`` if it is a file, else raise a one-line :class:`DatasetNotFoundError`."""
    if not os.path.isfile(path):
        raise DatasetNotFoundError(
            f"{dataset}: missing file '{path}' (the dataset folder must contain {layout}); "
            f"{_root_hint()}"
        )
    return path


def list_images(folder: str) -> List[str]:
    """Return the sorted paths of the image files directly inside ``folder``.

    Args:
        folder: an existing folder.
    Returns:
        Full paths of files whose extension is one of :data:`IMAGE_EXTENSIONS`, sorted by name
        so parsing is deterministic.
    """
    with os.scandir(folder) as entries:
        names = [e.name for e in entries
                 if e.name.lower().endswith(IMAGE_EXTENSIONS) and not e.is_dir()]
    names.sort()
    return [os.path.join(folder, n) for n in names]


def require_listed_files(paths, list_path: str, dataset: str, layout: str) -> None:
    """Raise a one-line :class:`DatasetNotFoundError` naming the first listed image missing.

    Args:
        paths: image paths read from ``list_path``.
        list_path: the list file (for the message).
        dataset: the dataset name.
        layout: the expected layout (for the message).
    """
    missing = next((p for p in paths if not os.path.isfile(p)), None)
    if missing is not None:
        raise DatasetNotFoundError(
            f"{dataset}: '{missing}' listed in '{list_path}' does not exist; the list files "
            f"and the images must sit in the documented layout ({layout})")
