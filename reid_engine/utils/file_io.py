"""Crash-safe file writes: a reader sees the old content or the new, never a mix."""
import contextlib
import os
import re
import tempfile
from typing import IO, Any, Callable, Iterator

from iopath.common.file_io import PathManager

__all__ = [
    "atomic_open",
    "atomic_write",
    "atomic_write_text",
    "fsync_dir",
    "remove_stale_temp_files",
    "AtomicWritePathManager",
]


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
    """
    with atomic_open(path, "wb") as f:
        write_fn(f)


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
