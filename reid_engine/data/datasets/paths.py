"""Locating datasets on disk: the data root, dataset folders and image files."""

import os
from typing import List, Sequence, Tuple

from ...utils.errors import ReidUserError
from .bases import DatasetFormatError

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


def _require(path: str, exists, kind: str, dataset: str, layout: str) -> str:
    if not exists(path):
        raise DatasetNotFoundError(
            f"{dataset}: missing {kind} '{path}' (the dataset folder must contain {layout}); "
            f"{_root_hint()}"
        )
    return path


def require_dir(path: str, dataset: str, layout: str) -> str:
    """Return ``path`` if it is a folder, else raise a one-line :class:`DatasetNotFoundError`."""
    return _require(path, os.path.isdir, "folder", dataset, layout)


def require_file(path: str, dataset: str, layout: str) -> str:
    """Return ``path`` if it is a file, else raise a one-line :class:`DatasetNotFoundError`."""
    return _require(path, os.path.isfile, "file", dataset, layout)


def read_name_id_list(list_path: str, dataset: str, line_format: str,
                      allow_negative: bool = False) -> List[Tuple[str, int]]:
    """Read a list file of ``<name> <integer id>`` lines (blank lines skipped).

    Args:
        list_path: the list file.
        dataset: dataset name for the error message.
        line_format: how a line should look, for the error message (e.g. "imagename vid").
        allow_negative: accept negative ids.
    Returns:
        ``(name, id)`` pairs in file order.
    Raises:
        DatasetFormatError: a malformed line, with its number and the expected format.
    """
    pairs = []
    with open(list_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            number = parts[1].lstrip("-") if allow_negative and len(parts) == 2 else (parts + [""])[1]
            if len(parts) != 2 or not number.isdigit():
                raise DatasetFormatError(
                    f"{dataset}: line {lineno} of '{list_path}' is '{line.strip()}', expected '{line_format}'")
            pairs.append((parts[0], int(parts[1])))
    return pairs


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
