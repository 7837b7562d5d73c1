"""Locating datasets on disk: the data root, dataset folders and image files."""

import logging
import os
from typing import Iterator, List, Optional, Sequence, Tuple

from ...utils.errors import ReidUserError
from .audit import collecting_problems, note_skipped_file, report_file_problem
from .folders import dataset_folders

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")
# Folders and files that operating systems and archivers leave in copies of a dataset
# (compared in lower case); every name starting with "." is left out as well.
SYSTEM_NAMES = frozenset({"__macosx", "thumbs.db", "desktop.ini"})


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


def is_hidden_or_system(name: str) -> bool:
    """Whether a file or folder name is one every listing leaves out.

    Names starting with ``.`` (macOS AppleDouble ``._<name>`` files, ``.DS_Store``, editor
    and sync files; the peers' glob listings skip them too), ``__MACOSX`` folders of zip
    archives, and ``Thumbs.db`` / ``desktop.ini`` of Windows.
    """
    return name.startswith(".") or name.lower() in SYSTEM_NAMES


def visible_entries(folder: str) -> Tuple[List[str], List[str]]:
    """The ``(file names, folder names)`` of ``folder``, each sorted, hidden and system names left out.

    The one listing every parser goes through (:func:`is_hidden_or_system` is the rule);
    the names left out are noted for ``reid-data check``.

    Args:
        folder: an existing folder.
    Returns:
        Sorted file names and sorted sub-folder names (links followed).
    """
    files, dirs = [], []
    with os.scandir(folder) as entries:
        for entry in entries:
            if is_hidden_or_system(entry.name):
                note_skipped_file(entry.path, "a hidden or system file")
            elif entry.is_dir():
                dirs.append(entry.name)
            else:
                files.append(entry.name)
    return sorted(files), sorted(dirs)


def visible_images(folder: str) -> Tuple[List[str], List[str]]:
    """The ``(image file names, sub-folder names)`` of ``folder``, each sorted.

    :func:`visible_entries` with the files that are not images (:data:`IMAGE_EXTENSIONS`,
    any case) left out and noted for ``reid-data check``.

    Args:
        folder: an existing folder.
    """
    files, dirs = visible_entries(folder)
    images = []
    for name in files:
        if name.lower().endswith(IMAGE_EXTENSIONS):
            images.append(name)
        else:
            note_skipped_file(os.path.join(folder, name), "not an image")
    return images, dirs


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def find_dataset_dir(root: str, dataset: str, candidates: Optional[Sequence[str]], layout: str) -> str:
    """Return the first existing folder among ``root/<candidate>``.

    When several of them exist the first is read and the choice is logged.

    Args:
        root: the data root.
        dataset: the dataset name used in the error message and to look up the accepted
            folder names in :data:`.folders.DATASET_FOLDERS` when ``candidates`` is None.
        candidates: folder names (relative to the root) accepted for this dataset, in
            order of preference; None for the table's names.
        layout: a short description of what the folder must contain (for the error).
    Returns:
        The path of the dataset folder.
    Raises:
        DatasetNotFoundError: none of the candidates exists (one line naming root, every
            name looked for, layout, fix).
    """
    if candidates is None:
        candidates = dataset_folders(dataset)
    found = [os.path.join(root, rel) for rel in candidates if os.path.isdir(os.path.join(root, rel))]
    if found:
        chosen = found[0]
        # A parent of the chosen folder (torchreid's flat 'market1501/' holding the nested
        # one) or the same folder under another case (macOS) is not a second copy.
        others = [p for p in found[1:] if not (chosen.startswith(p.rstrip(os.sep) + os.sep) or _same_folder(p, chosen))]
        if others:
            logger.info("%s: reading '%s' (also found %s; the accepted names in order: %s)", dataset, chosen,
                        ", ".join(f"'{p}'" for p in others), ", ".join(candidates))
        return chosen
    first, *others = candidates
    also = f" (or the same under {' or '.join(repr(c + '/') for c in others)})" if others else ""
    raise DatasetNotFoundError(
        f"{dataset} not found under the data root '{root}': expected '{first}/' containing "
        f"{layout}{also}; {_root_hint()}"
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


def require_one_dir(base: str, names: Sequence[str], dataset: str, layout: str) -> str:
    """The first existing folder among ``base/<name>`` (alternative spellings of one folder).

    Raises:
        DatasetNotFoundError: none exists (one line naming every spelling looked for).
    """
    for name in names:
        if os.path.isdir(os.path.join(base, name)):
            return os.path.join(base, name)
    raise DatasetNotFoundError(f"{dataset}: missing folder {' or '.join(repr(n + '/') for n in names)} in '{base}' "
                               f"(the dataset folder must contain {layout}); {_root_hint()}")


def list_lines(list_path: str, header: bool = False) -> Iterator[Tuple[int, str]]:
    """The non-blank lines of a text list file, stripped, with their 1-based line numbers.

    Args:
        list_path: the file (UTF-8).
        header: the first line is a header and is skipped.
    Yields:
        ``(line number, stripped line)``.
    """
    with open(list_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if line and not (header and lineno == 1):
                yield lineno, line


def read_name_id_list(list_path: str, dataset: str, line_format: str,
                      allow_negative: bool = False) -> List[Tuple[str, int]]:
    """Read a list file of ``<name> <integer id>`` lines (blank lines skipped).

    Args:
        list_path: the list file.
        dataset: dataset name for the error message.
        line_format: how a line should look, for the error message (e.g. "imagename vid").
        allow_negative: accept negative ids.
    Returns:
        ``(name, id)`` pairs in file order, malformed lines left out when problems are
        collected (``reid-data check`` lists every one of them).
    Raises:
        DatasetFormatError: a malformed line in a normal load (:mod:`.audit`), with its
            number and the expected format.
    """
    pairs = []
    for lineno, line in list_lines(list_path):
        parts = line.split()
        number = parts[1].lstrip("-") if allow_negative and len(parts) == 2 else (parts + [""])[1]
        if len(parts) != 2 or not number.isdigit():
            report_file_problem(dataset, f"{list_path}:{lineno}", f"a line '{line_format}', not '{line}'",
                                error=f"{dataset}: line {lineno} of '{list_path}' is '{line}', expected '{line_format}'")
            continue
        pairs.append((parts[0], int(parts[1])))
    return pairs


def list_images(folder: str) -> List[str]:
    """Return the sorted paths of the image files directly inside ``folder``.

    Args:
        folder: an existing folder.
    Returns:
        Full paths of files whose extension is one of :data:`IMAGE_EXTENSIONS`, sorted by name
        so parsing is deterministic. Hidden and system files (:func:`is_hidden_or_system`)
        and other files are left out (and noted for ``reid-data check``).
    """
    return [os.path.join(folder, name) for name in visible_images(folder)[0]]


def require_listed_files(paths, list_path: str, dataset: str, layout: str) -> List[bool]:
    """Check that every image read from a list file exists.

    Args:
        paths: image paths read from ``list_path``.
        list_path: the list file (for the message).
        dataset: the dataset name.
        layout: the expected layout (for the message).
    Returns:
        Per path, whether it exists (all True in a normal load, which raises instead).
    Raises:
        DatasetNotFoundError: a normal load names the first missing image in one line;
            while problems are collected every missing one is reported instead.
    """
    exists = [os.path.isfile(p) for p in paths]
    if not all(exists) and not collecting_problems():
        missing = paths[exists.index(False)]
        raise DatasetNotFoundError(
            f"{dataset}: '{missing}' listed in '{list_path}' does not exist; the list files "
            f"and the images must sit in the documented layout ({layout})")
    for path, ok in zip(paths, exists):
        if not ok:
            report_file_problem(dataset, path, f"an image listed in {list_path} (it does not exist)",
                                fix="restore the image or remove its line")
    return exists
