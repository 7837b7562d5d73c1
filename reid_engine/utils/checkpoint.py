"""Saving and loading checkpoints: atomic writes, safe loads, readable summaries.

Builds on fvcore's `Checkpointer` / `PeriodicCheckpointer` through their public
extension points (same API, same file layout: ``<save_dir>/<name>.pth`` plus a
``last_checkpoint`` file holding the basename of the newest one):

- the files are written through an :class:`~.file_io.AtomicWritePathManager`, so a
  crash at any moment never leaves a truncated file under a checkpoint's name, and
  ``last_checkpoint`` (written after the file) only ever names a complete file; a write
  that fails (disk full, quota, file size limit) removes its temporary file, leaves the
  previous checkpoint and ``last_checkpoint`` as they were and raises one line naming
  the path and the free space;
- each file carries a checksum of its content (:mod:`~.checksum`), checked on load;
- ``_load_file`` reads through :func:`~.safe_load.load_checkpoint_file`
  (``torch.load(weights_only=True)``; a checkpoint cannot run code unless the user
  opts in; one-line errors that name the path);
- ``resume_or_load`` falls back to the newest loadable checkpoint of the folder when
  the one ``last_checkpoint`` names is missing, truncated or corrupt;
- keys that do not fit the model are reported in one compact summary
  (:mod:`~.load_summary`), never a crash;
- keep-last-N looks at the folder, so it keeps working across restarts
  (:mod:`~.periodic_checkpointer`; its names are re-exported here).
"""
import contextlib
import logging
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import torch
from fvcore.common.checkpoint import Checkpointer as _FvCheckpointer

from . import comm
from .checksum import CHECKSUM_KEY, payload_checksum
from .errors import ReidUserError
from .file_io import AtomicWritePathManager, WriteErrorRecorder, remove_stale_temp_files, write_failure
from .load_summary import drop_tied_aliases, format_load_summary
from .periodic_checkpointer import CheckpointScheduleError, PeriodicCheckpointer
from .safe_load import (
    UNSAFE_LOAD_ENV,
    CheckpointError,
    CheckpointNotFoundError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    load_checkpoint_file,
    require_checkpoint_file,
    unsafe_globals_in,
)

__all__ = [
    "Checkpointer",
    "PeriodicCheckpointer",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "CheckpointScheduleError",
    "NoLoadableCheckpointError",
    "UNSAFE_LOAD_ENV",
    "load_checkpoint_file",
    "format_load_summary",
]

logger = logging.getLogger(__name__)


class Checkpointer(_FvCheckpointer):
    """Save and load a model plus other checkpointable objects (optimizer, scheduler...).

    Args:
        model: the model; DataParallel / DistributedDataParallel wrappers are unwrapped.
        save_dir: folder for ``<name>.pth`` files and ``last_checkpoint``; "" disables saving.
        save_to_disk: whether this process writes files; default: only the main process.
        allow_unsafe_load: allow files that need full (code-running) unpickling; the
            environment variable ``REID_ALLOW_UNSAFE_LOAD=1`` does the same.
        checkpointables: objects with ``state_dict()`` / ``load_state_dict()``, saved under
            their keyword name.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        save_dir: str = "",
        *,
        save_to_disk: Optional[bool] = None,
        allow_unsafe_load: bool = False,
        **checkpointables: Any,
    ) -> None:
        if save_to_disk is None:
            save_to_disk = comm.is_main_process()
        super().__init__(model, save_dir, save_to_disk=save_to_disk, **checkpointables)
        self.logger = logger
        # save() and fvcore's tag_last_checkpoint write through this manager: atomically.
        self.path_manager = AtomicWritePathManager()
        self.allow_unsafe_load = allow_unsafe_load
        self._source = ""
        self._unsafe_warned = False
        self._preread: Optional[Tuple[str, Dict[str, Any]]] = None  # (path, content) read by a resume

    # ---- saving

    def save(self, name: str, **extra: Any) -> None:
        """Write ``save_dir/name.pth`` atomically, then point ``last_checkpoint`` at it.

        Content: ``{"model": model.state_dict(), <key>: obj.state_dict() for each
        checkpointable, **extra, "checksum": "sha256:..."}``. Does nothing when saving is
        disabled (no save_dir, or not the writing process).

        Args:
            name: file name without ``.pth``.
            extra: further entries (e.g. ``iteration``); keep them tensors and plain
                Python values so that safe loading accepts them.

        Raises:
            FileWriteError: the write failed (disk full, quota, file size limit...); the
                partial file is removed, the previous files and ``last_checkpoint`` are kept.
        """
        basename = f"{name}.pth"
        if os.path.basename(basename) != basename:
            raise ValueError(f"checkpoint name {name!r} must be a plain file name, without folders")
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        data.update((key, obj.state_dict()) for key, obj in self.checkpointables.items())
        data.update(extra)
        data[CHECKSUM_KEY] = payload_checksum(data)
        path = writing = os.path.join(self.save_dir, basename)
        self.logger.info("Saving checkpoint to %s", path)
        recorder = None
        try:
            with self.path_manager.open(path, "wb") as f:
                recorder = WriteErrorRecorder(f)
                torch.save(data, recorder)
            writing = os.path.join(self.save_dir, "last_checkpoint")
            self.tag_last_checkpoint(basename)
        except Exception as e:
            # torch.save reports a failed write (disk full...) as a RuntimeError of its own.
            cause = e if isinstance(e, OSError) else getattr(recorder, "error", None)
            if cause is None or isinstance(e, ReidUserError):
                raise
            written = recorder.written if recorder is not None and writing == path else 0
            raise write_failure(writing, cause, "checkpoint", written=written,
                                then="then continue with --resume (the previous checkpoints and last_checkpoint "
                                "are unchanged)") from None
        remove_stale_temp_files(path)
        self._warn_if_unsafe(path)

    def _warn_if_unsafe(self, path: str) -> None:
        """Warn (once) at save time when a safe load would refuse the file, not at resume."""
        if self._unsafe_warned:
            return
        try:
            refused = unsafe_globals_in(path)
        except Exception:  # only a diagnostic; the file itself was written
            return
        if refused:
            self._unsafe_warned = True
            self.logger.warning(
                "Checkpoint %s holds objects a safe load refuses (%s); loading it will need "
                "%s=1. Make state_dict() return tensors and plain Python values.",
                path, ", ".join(refused), UNSAFE_LOAD_ENV,
            )

    # ---- loading

    def load(self, path: str, checkpointables: Optional[List[str]] = None) -> Dict[str, Any]:
        """Load a checkpoint into the model and the named checkpointables.

        Args:
            path: a checkpoint file; "" loads nothing (the model stays as initialized).
            checkpointables: names to restore; None = all present in the file, [] = model only.

        Returns:
            dict: entries of the file not consumed (e.g. ``iteration``, trainer state).

        Raises:
            CheckpointNotFoundError: `path` does not exist (a FileNotFoundError).
            CheckpointError: a corrupt file, or one that needs unsafe unpickling.
        """
        if path:
            require_checkpoint_file(path)  # fvcore would try a download or fail an assert
        self._source = path
        return super().load(path, checkpointables=checkpointables)

    def _load_file(self, f: str) -> Dict[str, Any]:
        """Read `f` (safely unless opted out) and normalize its layout to {"model": ...}."""
        preread, self._preread = self._preread, None
        if preread is not None and preread[0] == f:
            return preread[1]
        return load_checkpoint_file(f, allow_unsafe_load=self.allow_unsafe_load)

    def _log_incompatible_keys(self, incompatible: Any) -> None:
        """Log one summary of shape-skipped, missing and unexpected keys."""
        skipped = {k for k, _, _ in incompatible.incorrect_shapes}
        missing = drop_tied_aliases(self.model, list(incompatible.missing_keys))
        missing = [k for k in missing if k not in skipped]
        unexpected = list(incompatible.unexpected_keys)
        summary = format_load_summary(
            self._source or "the checkpoint",
            len(self.model.state_dict()),
            missing,
            unexpected,
            list(incompatible.incorrect_shapes),
        )
        if missing or unexpected or incompatible.incorrect_shapes:
            self.logger.warning(summary)
        else:
            self.logger.info(summary)

    def resume_or_load(self, path: str, *, resume: bool = True) -> Dict[str, Any]:
        """Resume from ``last_checkpoint`` (model and all checkpointables) or load `path`.

        Args:
            path: weights to load when not resuming (MODEL.WEIGHTS); may be "".
            resume: when True and ``save_dir`` has a ``last_checkpoint``, load that
                instead and ignore `path` (logged); when the file it names is missing,
                truncated or fails its checksum, warn in one line and load the newest
                loadable checkpoint of the folder (:func:`resume_candidates`); when True
                and there is no ``last_checkpoint``, log
                "no checkpoint found in <dir>: starting from scratch" and load `path`
                as the model's initial weights.

        Returns:
            same as :meth:`load`.

        Raises:
            NoLoadableCheckpointError: resuming, and no checkpoint of the folder can be read.
        """
        if resume and self.has_checkpoint():
            last = self.get_checkpoint_file()
            self.logger.info("Resuming from %s", last)
            if path:
                self.logger.info("MODEL.WEIGHTS (%s) is ignored because training resumes from %s", path, last)
            if last:
                return self._resume_from(last)
        elif resume:
            detail = f" (model initialized from {path})" if path else ""
            self.logger.info("no checkpoint found in %s: starting from scratch%s", self.save_dir or "''", detail)
        return self.load(path, checkpointables=[])

    def _resume_from(self, last: str) -> Dict[str, Any]:
        """Load `last` with all checkpointables; when it is missing or damaged, the newest
        loadable checkpoint of the folder instead (one warning line).

        Raises:
            NoLoadableCheckpointError: no candidate could be read (one line listing them).
        """
        tried = []
        candidates = [last] + [c for c in resume_candidates(self.save_dir) if c != last]
        for candidate in candidates:
            try:
                content = self._load_file(candidate)
            except (CorruptCheckpointError, CheckpointNotFoundError) as e:
                tried.append(f"{os.path.basename(candidate)} ({_failure_label(e)})")
                continue
            if tried:
                self.logger.warning(
                    "last_checkpoint names %s, which cannot be loaded; resuming from %s, the newest loadable "
                    "checkpoint in %s (skipped: %s)", os.path.basename(last), os.path.basename(candidate),
                    self.save_dir, ", ".join(tried))
            self._preread = (candidate, content)
            return self.load(candidate)
        raise NoLoadableCheckpointError(
            f"--resume: no checkpoint in {self.save_dir} can be loaded (tried {', '.join(tried)}); put a good "
            "checkpoint there and name it in last_checkpoint, or start without --resume in a new OUTPUT_DIR")


class NoLoadableCheckpointError(CheckpointError):
    """--resume found a ``last_checkpoint`` but no checkpoint of the folder can be read."""


# Files a Checkpointer writes: periodic "<prefix>_<iter:07d>.pth", "<prefix>_final.pth", "<prefix>_best.pth".
_CHECKPOINT_NAME = re.compile(r"^(?P<prefix>.+)_(?:(?P<iter>\d{7})|final|best)\.pth$")


def resume_candidates(save_dir: str) -> List[str]:
    """The checkpoints of a folder, newest first, for a resume to fall back on.

    Periodic files are ordered by the iteration in their name; ``*_final`` and ``*_best``
    go before every periodic file written earlier than them (modification time).

    Args:
        save_dir: the checkpoint folder.

    Returns:
        list: paths.
    """
    periodic, others = [], []
    with contextlib.suppress(OSError):
        for name in os.listdir(save_dir):
            match = _CHECKPOINT_NAME.match(name)
            path = os.path.join(save_dir, name)
            if not match or not os.path.isfile(path):
                continue
            if match.group("iter") is not None:
                periodic.append((int(match.group("iter")), path))
            else:
                others.append((_mtime(path), name.endswith("_final.pth"), path))
    ordered = [path for _, path in sorted(periodic, reverse=True)]
    mtimes = {path: _mtime(path) for path in ordered}  # one stat per file
    for mtime, _, path in sorted(others):  # oldest first: each insert goes before the newer ones
        position = next((i for i, p in enumerate(ordered) if mtimes[p] <= mtime), len(ordered))
        ordered.insert(position, path)
        mtimes[path] = mtime
    return ordered


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:  # deleted meanwhile: sorts last
        return float("-inf")


def _failure_label(error: Exception) -> str:
    """Why a checkpoint could not be read, in two or three words."""
    if isinstance(error, CheckpointNotFoundError):
        return "missing"
    if isinstance(error, ChecksumMismatchError):
        return "checksum mismatch"
    return "truncated or corrupt"
