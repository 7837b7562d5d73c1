"""Crash-safe file writes: a reader sees the old content or the new, never a mix."""
import os
import tempfile
from typing import IO, Callable

__all__ = ["atomic_write", "atomic_write_text", "fsync_dir"]


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


def atomic_write(path: str, write_fn: Callable[[IO[bytes]], None]) -> None:
    """Write a file atomically: temporary file in the same folder, fsync, rename.

    Args:
        path: the final file name.
        write_fn: called with the open binary temporary file; writes the content.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def atomic_write_text(path: str, text: str) -> None:
    """Write a UTF-8 text file atomically (see `atomic_write`)."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
