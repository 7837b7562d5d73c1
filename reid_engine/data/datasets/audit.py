"""Files that break a dataset's layout rules: a normal load stops at the first, a check collects them all.

Parsers call :func:`report_file_problem` for a file they cannot use (a name that does not
follow the pattern, a list line that names no file) and :func:`note_ignored_file` for an
image file they skip on purpose (an extension the loader does not read). In a normal load
the first problem raises a one-line :class:`DatasetFormatError` naming the file and the
rule, and ignored files pass silently. Inside :func:`collect_file_problems` (what
``reid-data check`` uses) both are recorded instead and the parser goes on without the file,
so one run lists everything.

Files every listing leaves out without a word (hidden and system files, files that are not
images: :func:`note_skipped_file`) are only counted, inside :func:`collect_skipped_files`,
so ``reid-data check`` can say how many there were.
"""

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator, List, Optional

from ..errors import DatasetFormatError

__all__ = ["FileProblem", "report_file_problem", "note_ignored_file", "collect_file_problems", "collecting_problems",
           "note_skipped_file", "collect_skipped_files"]


@dataclass(frozen=True)
class FileProblem:
    """A file (or list-file line) that does not fit the layout.

    Attributes:
        path: the file, or ``<list file>:<line number>`` for a list line.
        rule: what the layout expects there, e.g. ``"name <pid>_<camera>.jpg (e.g. 0001_1.jpg)"``.
    """

    path: str
    rule: str


_collected: contextvars.ContextVar[Optional[List[FileProblem]]] = contextvars.ContextVar(
    "reid_engine_dataset_problems", default=None)
_skipped: contextvars.ContextVar[Optional[List[FileProblem]]] = contextvars.ContextVar(
    "reid_engine_dataset_skipped_files", default=None)


def collecting_problems() -> bool:
    """Whether problems are being collected (inside :func:`collect_file_problems`) rather than raised."""
    return _collected.get() is not None


def report_file_problem(dataset: str, path: str, rule: str,
                        fix: str = "rename it or move it out of the folder", error: Optional[str] = None) -> None:
    """Report a file the parser cannot use; returns only while problems are being collected.

    Args:
        dataset: the dataset name (first word of the error).
        path: the offending file (or ``<list file>:<line>``).
        rule: what the layout expects, phrased to follow "expected".
        fix: what the user should do (end of the error).
        error: the whole one-line error of a normal load, where it is phrased otherwise.
    Raises:
        DatasetFormatError: outside :func:`collect_file_problems` (one line: dataset, path,
            rule, fix). The caller skips the file when this returns.
    """
    collected = _collected.get()
    if collected is None:
        raise DatasetFormatError(error or f"{dataset}: '{path}' does not fit the layout (expected {rule}); {fix}")
    collected.append(FileProblem(path, rule))


def note_ignored_file(path: str, rule: str) -> None:
    """Record an image file the loader skips on purpose (only while problems are collected).

    Args:
        path: the skipped file.
        rule: what the loader reads instead, e.g. ``"*.jpg files (this file is ignored)"``.
    """
    _record(_collected, path, rule)


def _record(target: contextvars.ContextVar, path: str, rule: str) -> None:
    """Append ``FileProblem(path, rule)`` to the list of ``target`` when one is being collected."""
    collected = target.get()
    if collected is not None:
        collected.append(FileProblem(path, rule))


@contextlib.contextmanager
def _collecting(target: contextvars.ContextVar) -> Iterator[List[FileProblem]]:
    """Give ``target`` a fresh list for the block; yield it."""
    found: List[FileProblem] = []
    token = target.set(found)
    try:
        yield found
    finally:
        target.reset(token)


def collect_file_problems():
    """Collect the problems of every dataset parsed inside the block instead of raising (a context manager).

    Yields:
        The list the problems are appended to, in the order the parsers met them.
    """
    return _collecting(_collected)


def note_skipped_file(path: str, reason: str) -> None:
    """Count a file a listing leaves out on purpose (only inside :func:`collect_skipped_files`).

    Args:
        path: the file or folder left out.
        reason: why, e.g. ``"a hidden or system file"`` or ``"not an image"``.
    """
    _record(_skipped, path, reason)


def collect_skipped_files():
    """Record the files left out by every listing inside the block (a context manager).

    Yields:
        The list of ``FileProblem(path, reason)`` the listings append to, in the order met.
    """
    return _collecting(_skipped)
