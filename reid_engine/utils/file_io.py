"""Crash-safe file writes: a reader sees the old content or the new, never a mix.

Whole files are replaced atomically (:func:`atomic_write`); files that grow (logs,
metrics.json, tensorboard events) grow by whole records (:class:`RecordFile`). Failed
writes (disk full, quota, file size limit, permissions) become one-line
:class:`FileWriteError` messages that name the path and the free space.
"""
import contextlib
import errno
import os
import re
import shutil
import signal
import tempfile
import threading
from typing import IO, Any, Callable, Iterator

from iopath.common.file_io import PathManager

from .errors import ReidUserError

__all__ = [
    "atomic_open",
    "atomic_write",
    "atomic_write_text",
    "fsync_dir",
    "remove_stale_temp_files",
    "AtomicWritePathManager",
    "FileWriteError",
    "RecordFile",
    "WriteErrorRecorder",
    "write_failure",
    "check_writable_dir",
    "ensure_writable_dir",
    "ignore_file_size_signal",
]

# What to do about a failed write, by errno.
_WRITE_FIX = {
    errno.ENOSPC: "free disk space",
    errno.EDQUOT: "free space within your quota (or raise it)",
    errno.EFBIG: "the file size limit (ulimit -f) is below the file's size: raise it",
    errno.EROFS: "the file system is read-only: choose another folder",
    errno.EACCES: "fix the folder's permissions or choose another folder",
    errno.EPERM: "fix the folder's permissions or choose another folder",
}


class FileWriteError(ReidUserError, OSError):
    """A file or folder that cannot be written (disk full, quota, size limit, permissions);
    the message names the path, the reason and the free space."""


def _human_size(num_bytes: float) -> str:
    """``"1.5 GiB"``, ``"512 B"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return ""  # not reached


def _free_space(path: str) -> str:
    """Free space of the file system holding `path` (or its nearest existing parent), e.g. "1.5 GiB"."""
    folder = os.path.abspath(path)
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        return _human_size(float(shutil.disk_usage(folder).free))
    except OSError:
        return "unknown space"


def _reason(err: OSError) -> str:
    """``"No space left on device (ENOSPC)"``: the system's words and the errno name."""
    reason = err.strerror or str(err) or type(err).__name__
    name = errno.errorcode.get(err.errno, "") if err.errno else ""
    return f"{reason} ({name})" if name else reason


def write_failure(path: str, err: OSError, what: str = "", then: str = "", written: int = 0) -> FileWriteError:
    """The one-line error for a write of `path` that failed with `err`.

    Args:
        path: the file that could not be written.
        err: the OSError the write raised.
        what: what the file is ("checkpoint"), first words of the message.
        then: what follows the fix (e.g. "then continue with --resume").
        written: bytes of the file written before the failure (named when > 0).

    Returns:
        FileWriteError: to raise (``from None``: the message says it all).
    """
    fix = _WRITE_FIX.get(err.errno, "check the folder's free space and permissions")
    progress = f" after {_human_size(written)} of it" if written > 0 else ""
    return FileWriteError(f"cannot write {what + ' ' if what else ''}{path}: {_reason(err)}{progress}; "
                          f"{_free_space(path)} free there now: {fix}{', ' + then if then else ''}")


class WriteErrorRecorder:
    """A writable file proxy that remembers the first OSError of a write or flush.

    Writers such as ``torch.save`` turn the OSError of a failed write (ENOSPC, EFBIG...)
    into their own RuntimeError; the recorded one still tells what happened.

    Args:
        f: the open file.
    """

    def __init__(self, f: IO[bytes]):
        self._f = f
        self.error: "OSError | None" = None
        self.written = 0  # bytes accepted by the file

    def _recorded(self, method: Callable, *args: Any) -> Any:
        try:
            return method(*args)
        except OSError as e:
            self.error = self.error or e
            raise

    def write(self, data: Any) -> int:
        """Write `data` to the file (recording a failure)."""
        count = self._recorded(self._f.write, data)
        self.written += count or 0
        return count

    def flush(self) -> None:
        """Flush the file (recording a failure)."""
        self._recorded(self._f.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


class RecordFile:
    """A file that grows by whole records (log lines, metrics lines, tensorboard events).

    Each :meth:`write` appends its record completely or not at all: a write that fails
    (disk full, quota, file size limit) cuts the file back to where the record began, so
    a reader (or a resumed run appending to it) never meets half a line. The first
    failure is kept in ``error`` and every later write raises it again without touching
    the file: what follows a lost record never lands after a gap. Nothing is buffered
    (one ``os.write`` per record, like a line-buffered stream), so nothing is left to
    fail at exit.

    Args:
        path: the file, created when missing, else appended to.
        what: what the file holds, for the error message (e.g. "metrics to").
    """

    def __init__(self, path: str, what: str = ""):
        self.name = path  # like an open file's name
        self.what = what
        self.error: "OSError | None" = None
        # O_APPEND: each record lands at the end even when another process (a forked
        # loader worker logging) appends too.
        self._fd: "int | None" = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                                         0o666)

    def write(self, data: "str | bytes") -> int:
        """Append one record (a str is written as UTF-8).

        Returns:
            int: the length of `data`.

        Raises:
            OSError: the write failed, now or before (the file holds no part of the record).
        """
        if self.error is not None:
            raise self.error
        if self._fd is None:
            raise ValueError(f"write to the closed file {self.name}")
        view = memoryview(data.encode("utf-8") if isinstance(data, str) else data).cast("B")
        done = 0
        try:
            while done < len(view):  # near a size limit the system writes part of it, then fails
                done += os.write(self._fd, view[done:])
        except OSError as e:
            self.error = e
            if done:  # cutting a file back needs no free space
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - done)
            raise
        return len(data)

    def flush(self) -> None:
        """Nothing to flush: every record went to the system when written."""

    def failure(self, then: str = "") -> "FileWriteError | None":
        """The one-line error for the first failed write (None when none failed).

        Args:
            then: what follows the fix (what to do next, what the file lacks).
        """
        return None if self.error is None else write_failure(self.name, self.error, self.what, then)

    def close(self) -> None:
        """Close the file (again: nothing)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def check_writable_dir(path: str, key: str) -> None:
    """Check, without creating anything, that a folder exists or can be created and is writable.

    Args:
        path: the folder.
        key: the config key or flag that names it (e.g. "OUTPUT_DIR"), for the message.

    Raises:
        FileWriteError: a file in the way, or no write permission on the nearest existing folder.
    """
    target = os.path.abspath(path)
    existing = target
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise FileWriteError(f"{key} '{path}' cannot be a folder: '{existing}' is a file; move the file "
                             f"away or set {key} to another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise FileWriteError(f"{key} '{path}' is not writable: no write permission on '{existing}' (or a "
                             f"read-only file system); set {key} to a folder you can write to")


def ensure_writable_dir(path: str, key: str) -> None:
    """Create a folder when missing and prove it writable by writing and removing a small file.

    Args:
        path: the folder.
        key: the config key or flag that names it, for the message.

    Raises:
        FileWriteError: the folder cannot be created or written (one line naming `key`).
    """
    check_writable_dir(path, key)
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write_test.", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise FileWriteError(f"{key} '{path}' is not writable: {_reason(e)}; set {key} to a folder "
                             "you can write to") from None


def ignore_file_size_signal() -> None:
    """Ignore SIGXFSZ, so that a write beyond the file size limit (ulimit -f) fails with EFBIG
    (a clean error, previous files intact) instead of killing the process. Main thread only
    (elsewhere it does nothing)."""
    if hasattr(signal, "SIGXFSZ") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def fsync_dir(path: str) -> None:
    """Flush a directory entry to disk so a completed rename survives a power cut."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems/platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open `path` for writing so that it appears complete or not at all.

    Yields a temporary file in the same folder (named ``.<name>.<8 chars>.tmp``); when
    the block ends normally it is flushed, fsynced and renamed over `path`; when the
    block raises, it is deleted and `path` keeps its old content.

    Args:
        path: the final file name; its folder is created when missing.
        mode: "wb" (bytes) or "w" (UTF-8 text).

    Yields:
        The open temporary file.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open supports the modes 'wb' and 'w', not {mode!r}")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def atomic_write(path: str, write_fn: Callable[[IO[bytes]], None]) -> None:
    """Write a file atomically: temporary file in the same folder, fsync, rename.

    Args:
        path: the final file name.
        write_fn: called with the open binary temporary file; writes the content.

    Raises:
        FileWriteError: the write failed (disk full, quota, size limit, permissions): one
            line naming the path and the free space; `path` keeps its old content.
    """
    try:
        with atomic_open(path, "wb") as f:
            write_fn(f)
    except OSError as e:
        if isinstance(e, ReidUserError) or e.errno is None:
            raise
        raise write_failure(path, e) from None


def atomic_write_text(path: str, text: str) -> None:
    """Write a UTF-8 text file atomically (see `atomic_write`)."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def remove_stale_temp_files(path: str) -> None:
    """Delete the temporaries of `path` left by a writer killed before its rename.

    Only call it from the one process that writes `path`: a concurrent writer's
    temporary would be deleted too.
    """
    dirname, basename = os.path.split(path)
    # atomic_open names them like tempfile.mkstemp: .<name>.<8 chars>.tmp
    pattern = re.compile(r"^\." + re.escape(basename) + r"\.[A-Za-z0-9_]{8}\.tmp$")
    with contextlib.suppress(OSError):
        for name in os.listdir(dirname or "."):
            if pattern.match(name):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(dirname, name))


class AtomicWritePathManager(PathManager):
    """An iopath PathManager whose ``open(path, "w" / "wb")`` writes atomically.

    fvcore's Checkpointer writes its files through ``self.path_manager``; giving it this
    manager makes its own ``save`` and ``tag_last_checkpoint`` crash-safe. Reads and
    other modes behave as iopath's. No URL handler is registered: nothing is downloaded.
    """

    def open(self, path: str, mode: str = "r", buffering: int = -1, **kwargs: Any) -> Any:
        """Like `PathManager.open`, but "w" / "wb" return an :func:`atomic_open` context.

        Args:
            path: a local path.
            mode: the open mode.
            buffering: passed to iopath for other modes.
            kwargs: passed to iopath for other modes.

        Returns:
            A context manager yielding the file ("w" / "wb"), else iopath's file object.
        """
        if mode in ("w", "wb"):
            return atomic_open(path, mode)
        return super().open(path, mode, buffering, **kwargs)
