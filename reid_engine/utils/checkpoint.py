"""Saving and loading checkpoints: atomic writes, safe loads, readable summaries.

Builds on fvcore's `Checkpointer` / `PeriodicCheckpointer` (same API, same file
layout: ``<save_dir>/<name>.pth`` plus a ``last_checkpoint`` file holding the basename
of the newest one) and changes what matters for long training jobs:

- a crash at any moment never leaves a truncated file under a checkpoint's name, and
  ``last_checkpoint`` only ever names a complete file;
- files are read with ``torch.load(weights_only=True)``, so a checkpoint cannot run
  code; loading one that needs full unpickling is an explicit opt-in;
- bad files give one-line errors that name the path;
- keys that do not fit the model are reported in one compact summary, never a crash;
- keep-last-N looks at the folder, so it keeps working across restarts.
"""
import contextlib
import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch
from fvcore.common.checkpoint import Checkpointer as _FvCheckpointer
from fvcore.common.checkpoint import PeriodicCheckpointer as _FvPeriodicCheckpointer
from fvcore.common.checkpoint import _filter_reused_missing_keys

from . import comm
from .errors import ReidUserError
from .file_io import atomic_write

__all__ = [
    "Checkpointer",
    "PeriodicCheckpointer",
    "CheckpointError",
    "UNSAFE_LOAD_ENV",
    "load_checkpoint_file",
    "format_load_summary",
]

UNSAFE_LOAD_ENV = "REID_ALLOW_UNSAFE_LOAD"
_LAST_CHECKPOINT = "last_checkpoint"
# Longest list of key groups printed per category in the load summary.
_MAX_GROUPS_SHOWN = 20

logger = logging.getLogger(__name__)


class CheckpointError(ReidUserError, RuntimeError):
    """A checkpoint file that cannot be (safely) read; the message names the path."""


# --------------------------------------------------------------------- writing files


def _remove_stale_temp_files(path: str) -> None:
    """Delete temporaries of `path` left by a writer that was killed mid-save."""
    dirname, basename = os.path.split(path)
    # file_io.atomic_write names them like tempfile.mkstemp: .<name>.<8 chars>.tmp
    pattern = re.compile(r"^\." + re.escape(basename) + r"\.[A-Za-z0-9_]{8}\.tmp$")
    with contextlib.suppress(OSError):
        for name in os.listdir(dirname or "."):
            if pattern.match(name):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(dirname, name))


# --------------------------------------------------------------------- reading files


def _numpy_safe_globals() -> List[Any]:
    """numpy types allowed in safe loads: arrays and scalars of plain dtypes.

    Their reconstruction cannot call arbitrary code (an object array's elements still
    go through the restricted unpickler), and older checkpoints hold them.
    """
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        allowed += [t for t in vars(dtypes).values() if isinstance(t, type) and issubclass(t, np.dtype)]
    return allowed


def _unsafe_load_allowed(flag: bool) -> bool:
    return flag or os.environ.get(UNSAFE_LOAD_ENV, "").strip().lower() in ("1", "true", "yes")


def _short_reason(exc: BaseException) -> str:
    """The informative part of a torch.load error, as one short sentence."""
    text = str(exc)
    # The weights-only unpickler buries the cause after paragraphs of advice.
    match = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    line = match.group(1) if match else next((ln for ln in text.splitlines() if ln.strip()), "")
    line = line.strip().split(". ")[0]
    return f"{type(exc).__name__}: {line[:160]}" if line else type(exc).__name__


def _global_resolves(name: str) -> bool:
    """False when `name` certainly names nothing (a truncated file cuts names short).

    Only modules already imported are inspected: a name from an untrusted file must
    never make us import anything.
    """
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            obj: Any = module
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return True  # module not imported: cannot tell, assume it exists


def _require_file(path: str) -> None:
    """Raise a FileNotFoundError naming `path` when it is not a file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"checkpoint not found: {path} (check MODEL.WEIGHTS or the path you passed; "
            "URLs are not downloaded, fetch the file first)"
        )


def _read_checkpoint_file(path: str, allow_unsafe: bool) -> Any:
    """torch.load a file on CPU, safely unless `allow_unsafe`; one-line errors.

    Raises:
        FileNotFoundError: `path` is not a file.
        CheckpointError: unreadable file, or one that needs unsafe unpickling.
    """
    _require_file(path)
    try:
        if allow_unsafe:
            return torch.load(path, map_location="cpu", weights_only=False)
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for bad files; classify them
        refused = re.findall(r"GLOBAL ([\w.]+)", str(e))
        if refused and all(map(_global_resolves, refused)) and not allow_unsafe:
            raise CheckpointError(
                f"{path} holds Python objects that a safe load refuses ({', '.join(sorted(set(refused)))}): "
                "unpickling them could run arbitrary code; if you trust the file, opt in with "
                f"Checkpointer(..., allow_unsafe_load=True) or the environment variable {UNSAFE_LOAD_ENV}=1"
            ) from None
        raise CheckpointError(
            f"{path} is not a readable checkpoint (truncated or corrupt, or not written by "
            f"torch.save?): {_short_reason(e)}"
        ) from None


def _is_tensor_like(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _as_checkpoint_dict(path: str, loaded: Any) -> Dict[str, Any]:
    """Bring the layouts we accept to ``{"model": state_dict, **other_entries}``.

    Accepted: ``{"model": sd, ...}`` (ours, fast-reid's, detectron2's),
    ``{"state_dict": sd, ...}`` (torchreid and others) and a bare state dict
    (torchvision's ``.pth`` files).
    """
    if not isinstance(loaded, Mapping):
        raise CheckpointError(
            f"{path} is not a model checkpoint: it holds a {type(loaded).__name__}, expected a dict "
            "with a 'model' state dict or a state dict of tensors"
        )
    checkpoint = dict(loaded)
    if isinstance(checkpoint.get("model"), Mapping):
        pass
    elif isinstance(checkpoint.get("state_dict"), Mapping):
        checkpoint["model"] = checkpoint.pop("state_dict")
    elif checkpoint and all(_is_tensor_like(v) for v in checkpoint.values()):
        checkpoint = {"model": loaded}
    else:
        keys = ", ".join(sorted(map(str, checkpoint))[:8]) or "none"
        raise CheckpointError(
            f"{path} is not a model checkpoint: no 'model' state dict and not a state dict of "
            f"tensors (top-level keys: {keys})"
        )
    bad = [k for k, v in checkpoint["model"].items() if not _is_tensor_like(v)]
    if bad:
        raise CheckpointError(
            f"{path}: the model state dict holds non-tensor values (first: {bad[0]!r} of type "
            f"{type(checkpoint['model'][bad[0]]).__name__}); it is not a model checkpoint"
        )
    return checkpoint


def load_checkpoint_file(path: str, allow_unsafe_load: bool = False) -> Dict[str, Any]:
    """Read a checkpoint file without a model: ``{"model": state_dict, **other_entries}``.

    Same rules as `Checkpointer.load` (safe unpickling unless `allow_unsafe_load` or
    ``REID_ALLOW_UNSAFE_LOAD=1``; accepted layouts; one-line errors).

    Args:
        path: the file.
        allow_unsafe_load: allow files that need full unpickling.

    Returns:
        dict: the normalised checkpoint, tensors on CPU.
    """
    loaded = _read_checkpoint_file(path, allow_unsafe=_unsafe_load_allowed(allow_unsafe_load))
    return _as_checkpoint_dict(path, loaded)


# --------------------------------------------------------------------- load summary


def _group_keys(keys: Iterable[str]) -> List[str]:
    """Compact key groups: ``a.b.{bias, weight}`` for keys sharing a module prefix."""
    groups: Dict[str, List[str]] = {}
    for key in sorted(keys):
        head, _, tail = key.rpartition(".")
        groups.setdefault(head, []).append(tail)
    lines = []
    for head, tails in groups.items():
        if not head:
            lines.extend(tails)
        elif len(tails) == 1:
            lines.append(f"{head}.{tails[0]}")
        else:
            lines.append(f"{head}.{{{', '.join(tails)}}}")
    return lines


def _bounded(lines: List[str]) -> List[str]:
    if len(lines) <= _MAX_GROUPS_SHOWN:
        return lines
    return lines[:_MAX_GROUPS_SHOWN] + [f"... and {len(lines) - _MAX_GROUPS_SHOWN} more"]


def format_load_summary(
    source: str,
    num_model_keys: int,
    missing: List[str],
    unexpected: List[str],
    incorrect_shapes: List[Tuple[str, Tuple[int, ...], Tuple[int, ...]]],
) -> str:
    """One readable report of how a state dict fitted a model.

    Args:
        source: the file loaded (for the first line).
        num_model_keys: entries in the model's state dict.
        missing: model keys the checkpoint did not provide (shape-skipped ones excluded).
        unexpected: checkpoint keys the model does not have.
        incorrect_shapes: (key, checkpoint shape, model shape) for skipped entries.

    Returns:
        str: a multi-line message.
    """
    loaded = num_model_keys - len(missing) - len(incorrect_shapes)
    lines = [f"Loaded {loaded} of {num_model_keys} model tensors from {source}."]
    if incorrect_shapes:
        lines.append(f"Skipped {len(incorrect_shapes)} with a different shape (checkpoint vs model):")
        shown = [f"  {k}: {tuple(c)} vs {tuple(m)}" for k, c, m in sorted(incorrect_shapes)]
        lines.extend(_bounded(shown))
    if missing:
        lines.append(f"Not in the checkpoint, left as initialised ({len(missing)}):")
        lines.extend("  " + g for g in _bounded(_group_keys(missing)))
    if unexpected:
        lines.append(f"In the checkpoint but not used by the model ({len(unexpected)}):")
        lines.extend("  " + g for g in _bounded(_group_keys(unexpected)))
    return "\n".join(lines)


# --------------------------------------------------------------------- checkpointers


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
        self.allow_unsafe_load = allow_unsafe_load
        self._source = ""
        self._unsafe_warned = False

    # ---- saving

    def save(self, name: str, **extra: Any) -> None:
        """Write ``save_dir/name.pth`` atomically, then point ``last_checkpoint`` at it.

        Content: ``{"model": model.state_dict(), <key>: obj.state_dict() for each
        checkpointable, **extra}``. Does nothing when saving is disabled (no save_dir,
        or not the writing process).

        Args:
            name: file name without ``.pth``.
            extra: further entries (e.g. ``iteration``); keep them tensors and plain
                Python values so that safe loading accepts them.
        """
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        for key, obj in self.checkpointables.items():
            data[key] = obj.state_dict()
        data.update(extra)

        basename = f"{name}.pth"
        if os.path.basename(basename) != basename:
            raise ValueError(f"checkpoint name {name!r} must be a plain file name, without folders")
        path = os.path.join(self.save_dir, basename)
        self.logger.info("Saving checkpoint to %s", path)
        atomic_write(path, lambda f: torch.save(data, f))
        _remove_stale_temp_files(path)
        self._warn_if_unsafe(path)
        self.tag_last_checkpoint(basename)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        """Atomically write ``last_checkpoint`` holding the given basename.

        Args:
            last_filename_basename: basename of a checkpoint file already complete on disk.
        """
        path = os.path.join(self.save_dir, _LAST_CHECKPOINT)
        atomic_write(path, lambda f: f.write(last_filename_basename.encode("utf-8")))

    def _warn_if_unsafe(self, path: str) -> None:
        """Warn (once) at save time when a safe load would refuse the file, not at resume."""
        if self._unsafe_warned:
            return
        try:
            refused = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:  # only a diagnostic; the file itself was written
            return
        allowed = {f"{g.__module__}.{g.__qualname__}" for g in _numpy_safe_globals()}
        refused = [g for g in refused if g not in allowed]
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
            path: a checkpoint file; "" loads nothing (the model stays as initialised).
            checkpointables: names to restore; None = all present in the file, [] = model only.

        Returns:
            dict: entries of the file not consumed (e.g. ``iteration``, trainer state).

        Raises:
            FileNotFoundError: `path` does not exist.
            CheckpointError: a corrupt file, or one that needs unsafe unpickling.
        """
        if path:
            _require_file(path)  # fvcore would try a download or fail an assert
        self._source = path
        return super().load(path, checkpointables=checkpointables)

    def _load_file(self, f: str) -> Dict[str, Any]:
        """Read `f` (safely unless opted out) and normalise its layout to {"model": ...}."""
        return load_checkpoint_file(f, allow_unsafe_load=self.allow_unsafe_load)

    def _log_incompatible_keys(self, incompatible: Any) -> None:
        """Log one summary of shape-skipped, missing and unexpected keys."""
        skipped = {k for k, _, _ in incompatible.incorrect_shapes}
        missing = [k for k in incompatible.missing_keys if k not in skipped]
        if missing:
            # Tied parameters loaded under another name are not missing.
            missing = _filter_reused_missing_keys(self.model, missing)
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
                instead and ignore `path` (logged); when True and there is none, log
                "no checkpoint found in <dir>: starting from scratch" and load `path`
                as the model's initial weights.

        Returns:
            same as :meth:`load`.
        """
        if resume and self.has_checkpoint():
            last = self.get_checkpoint_file()
            self.logger.info("Resuming from %s", last)
            if path:
                self.logger.info("MODEL.WEIGHTS (%s) is ignored because training resumes from %s", path, last)
            return self.load(last)
        if resume:
            detail = f" (model initialised from {path})" if path else ""
            self.logger.info("no checkpoint found in %s: starting from scratch%s", self.save_dir or "''", detail)
        return self.load(path, checkpointables=[])


class PeriodicCheckpointer(_FvPeriodicCheckpointer):
    """Save ``{prefix}_{iter:07d}`` every `period` iterations and ``{prefix}_final`` at the end.

    With `max_to_keep`, after each periodic save only the newest N periodic files in
    the folder are kept; the folder (not memory) is the record, so this holds across
    restarts. The file ``last_checkpoint`` names and ``*_final`` / ``*_best`` files are
    never deleted.

    Args:
        checkpointer: the Checkpointer that writes the files.
        period: save when ``(iteration + 1) % period == 0``.
        max_iter: when given, save ``{prefix}_final`` at iteration ``max_iter - 1``.
        max_to_keep: how many periodic checkpoints to keep (None: all).
        file_prefix: file name prefix.
    """

    def __init__(
        self,
        checkpointer: _FvCheckpointer,
        period: int,
        max_iter: Optional[int] = None,
        max_to_keep: Optional[int] = None,
        file_prefix: str = "model",
    ) -> None:
        if int(period) < 1:
            raise ValueError(f"checkpoint period must be a positive number of iterations, got {period}")
        if max_to_keep is not None and int(max_to_keep) < 1:
            raise ValueError(f"max_to_keep must be at least 1 (or None to keep all), got {max_to_keep}")
        super().__init__(checkpointer, period, max_iter=max_iter, max_to_keep=max_to_keep, file_prefix=file_prefix)
        self._periodic_name = re.compile(r"^" + re.escape(file_prefix) + r"_(\d{7})\.pth$")

    def step(self, iteration: int, **kwargs: Any) -> None:
        """Save when the schedule says so.

        Args:
            iteration: the iteration just finished, in [0, max_iter - 1].
            kwargs: extra entries for the checkpoint (``iteration`` is always added).
        """
        iteration = int(iteration)
        state = {"iteration": iteration, **kwargs}
        if (iteration + 1) % self.period == 0:
            self.checkpointer.save(f"{self.file_prefix}_{iteration:07d}", **state)
            if self.max_to_keep is not None:
                self.delete_old_checkpoints()
        if self.max_iter is not None and iteration >= self.max_iter - 1:
            self.checkpointer.save(f"{self.file_prefix}_final", **state)

    def delete_old_checkpoints(self) -> List[str]:
        """Delete periodic files in the folder beyond the newest `max_to_keep`.

        Returns:
            list: the paths deleted (empty on processes that do not write).
        """
        save_dir = self.checkpointer.save_dir
        if not save_dir or not self.checkpointer.save_to_disk or self.max_to_keep is None:
            return []
        periodic = []
        for name in os.listdir(save_dir):
            match = self._periodic_name.match(name)
            if match:
                periodic.append((int(match.group(1)), name))
        periodic.sort()
        protected = os.path.basename(self.checkpointer.get_checkpoint_file())
        deleted = []
        for _, name in periodic[: max(0, len(periodic) - self.max_to_keep)]:
            if name == protected:
                continue
            path = os.path.join(save_dir, name)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                deleted.append(path)
        if deleted:
            logger.info("Deleted %d old checkpoint(s), keeping the newest %d: %s",
                        len(deleted), self.max_to_keep, ", ".join(os.path.basename(p) for p in deleted))
        return deleted
