"""Reading folders by a layout's rules: files of one extension, identity sub-folders, name fields.

The helpers of the parsers that read ids and cameras as text (folder names, fields of a
file name) and number them afterwards. Every file they cannot use goes through
:mod:`.audit`, so a normal load stops at the first one with a one-line error and
``reid-data check`` lists them all.
"""

import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .audit import note_ignored_file, report_file_problem
from .bases import Item
from .paths import visible_images

__all__ = ["RawItem", "list_files", "walk_files", "subfolders", "name_fields", "match_names",
           "number_raw_items", "text_labels"]

RawItem = Tuple[str, str, str]  # (path, identity text, camera text) as found on disk

Extensions = Union[str, Tuple[str, ...]]


def _pattern(extensions: Extensions) -> str:
    extensions = (extensions,) if isinstance(extensions, str) else extensions
    return " / ".join(f"*{ext}" for ext in extensions)


def list_files(folder: str, extensions: Extensions, dataset: str) -> List[str]:
    """The files of ``folder`` with one of ``extensions`` (case-sensitive, as a glob), sorted.

    Image files with another extension are skipped (and noted by ``reid-data check``);
    when they are all the folder holds, that is an error naming one of them. Hidden and
    system files and files that are not images are left out (counted by ``reid-data check``).

    Args:
        folder: an existing folder.
        extensions: e.g. ``".jpg"`` or ``(".jpg", ".png")``.
        dataset: the dataset name (for errors).
    Returns:
        Full paths sorted by name.
    Raises:
        DatasetFormatError: the folder holds images, none with an accepted extension.
    """
    return _with_extensions(folder, visible_images(folder)[0], extensions, dataset)


def _with_extensions(folder: str, images: List[str], extensions: Extensions, dataset: str) -> List[str]:
    """The full paths of the ``images`` of ``folder`` that end with one of ``extensions``; the
    other images are noted (an error when they are all there is), see :func:`list_files`."""
    extensions = (extensions,) if isinstance(extensions, str) else tuple(extensions)
    kept = [name for name in images if name.endswith(extensions)]
    others = [os.path.join(folder, name) for name in images if not name.endswith(extensions)]
    if others and not kept:
        report_file_problem(dataset, others[0], f"{_pattern(extensions)} files in this folder, found none",
                            fix="convert the images or put them where the layout expects them")
        others = others[1:]
    for path in others:
        note_ignored_file(path, f"{_pattern(extensions)} files here (this one is not read)")
    return [os.path.join(folder, name) for name in kept]


def walk_files(folder: str, extensions: Extensions, dataset: str) -> List[str]:
    """:func:`list_files` of ``folder`` and of every folder below it, sorted by path.

    Hidden and system folders are left out; links to folders are not followed (as
    ``os.walk``), so a link loop cannot recurse forever.
    """
    images, folders = visible_images(folder)  # one listing per folder
    found = _with_extensions(folder, images, extensions, dataset)
    for name in folders:
        if not os.path.islink(os.path.join(folder, name)):
            found.extend(walk_files(os.path.join(folder, name), extensions, dataset))
    return sorted(found)


def subfolders(folder: str, dataset: str = "", expected: str = "") -> List[str]:
    """The names of the sub-folders of ``folder``, sorted.

    Args:
        folder: an existing folder.
        dataset: the dataset name; with ``expected``, image files lying directly in
            ``folder`` are noted as not read (``reid-data check`` lists them).
        expected: where such images belong, e.g. ``"inside <pid>/ sub-folders"``.
    Returns:
        Sub-folder names (hidden and system ones left out).
    """
    images, names = visible_images(folder)
    if dataset and expected:
        for name in images:
            note_ignored_file(os.path.join(folder, name), f"images {expected} (this one is not read)")
    return names


def name_fields(path: str, separator: str, count: int, dataset: str, rule: str) -> Optional[List[str]]:
    """Split the file name of ``path`` on ``separator``; it must give at least ``count`` fields.

    Args:
        path: the image path.
        separator: e.g. ``"_"``.
        count: the fewest fields the layout needs.
        dataset: the dataset name (for errors).
        rule: the expected name, for the error (e.g. ``"<pid>_<camera>_... .png"``).
    Returns:
        The fields (the last one keeps the extension), or None for a name that breaks the
        rule while problems are collected.
    Raises:
        DatasetFormatError: too few fields in a normal load.
    """
    fields = os.path.basename(path).split(separator)
    if len(fields) < count:
        report_file_problem(dataset, path, rule)
        return None
    return fields


def match_names(paths: Iterable[str], pattern: "re.Pattern[str]", dataset: str,
                rule: str) -> List[Tuple[str, "re.Match[str]"]]:
    """Match each file name against ``pattern`` (from its start).

    Args:
        paths: image paths.
        pattern: the compiled name pattern.
        dataset: the dataset name (for errors).
        rule: the expected name, for errors (e.g. ``"a name <pid 4 digits><image 3 digits>.png"``).
    Returns:
        ``(path, match)`` of the names that match; the others are reported (a normal load
        raises at the first).
    """
    matched = []
    for path in paths:
        match = pattern.match(os.path.basename(path))
        if match is None:
            report_file_problem(dataset, path, rule)
        else:
            matched.append((path, match))
    return matched


def text_labels(values: Iterable[str]) -> Dict[str, int]:
    """Number distinct texts 0..N-1 in sorted (string) order.

    fast-reid sorts its ``<prefix>_<text>`` ids and cameras as strings before numbering
    them, so within one dataset this gives the same order.
    """
    return {value: index for index, value in enumerate(sorted(set(values)))}


def number_raw_items(raw: Sequence[RawItem]) -> List[Item]:
    """Turn ``(path, identity text, camera text)`` into ``(path, pid, camid)`` with :func:`text_labels`.

    Texts are compared as they are, so ``"0001"`` and ``"1"`` stay two identities (as in
    fast-reid, which keeps the id text with its padding).
    """
    pids = text_labels(pid for _, pid, _ in raw)
    cams = text_labels(cam for _, _, cam in raw)
    return [(path, pids[pid], cams[cam]) for path, pid, cam in raw]
