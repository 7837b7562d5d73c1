"""The one safe reader of weight files: model checkpoints, ImageNet weights, tool inputs.

Files are read with ``torch.load(weights_only=True)`` (plus plain numpy arrays and
scalars), so a file cannot run code; full unpickling is an explicit opt-in. NumPy ``.npz``
archives (JAX / big_vision releases) are read with ``allow_pickle=False``. Bad files
give one-line errors that name the path. The accepted layouts are brought to
``{"model": state_dict, **other_entries}``.
"""
import os
import re
import sys
import zipfile
from collections.abc import Mapping
from typing import Any, Dict, List

import numpy as np
import torch

from .checksum import CHECKSUM_KEY, payload_checksum, stored_checksum
from .errors import ReidUserError

__all__ = [
    "UNSAFE_LOAD_ENV",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "ChecksumMismatchError",
    "load_checkpoint_file",
    "require_checkpoint_file",
    "safe_load_globals",
    "unsafe_globals_in",
]

UNSAFE_LOAD_ENV = "REID_ALLOW_UNSAFE_LOAD"


class CheckpointError(ReidUserError, RuntimeError):
    """A checkpoint file that cannot be (safely) read; the message names the path."""


class CheckpointNotFoundError(ReidUserError, FileNotFoundError):
    """A checkpoint path that names no file; the message names the path."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint whose bytes are damaged: truncated, not a torch file, or a checksum mismatch."""


class ChecksumMismatchError(CorruptCheckpointError):
    """A checkpoint whose content does not match the checksum stored in it."""


def safe_load_globals() -> List[Any]:
    """numpy types allowed in safe loads: arrays and scalars of plain dtypes.

    Their reconstruction cannot call arbitrary code (an object array's elements still
    go through the restricted unpickler), and older checkpoints hold them.

    Returns:
        list: the objects to pass to ``torch.serialization.safe_globals``.
    """
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        allowed += [t for t in vars(dtypes).values() if isinstance(t, type) and issubclass(t, np.dtype)]
    return allowed


def unsafe_globals_in(path: str) -> List[str]:
    """Names of the Python objects in the file at `path` that a safe load would refuse.

    Args:
        path: a file written by ``torch.save``.

    Returns:
        list: dotted names, empty when a safe load accepts the file.
    """
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in safe_load_globals()}
    return [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(path) if g not in allowed]


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


def require_checkpoint_file(path: str) -> None:
    """Raise :class:`CheckpointNotFoundError` naming `path` when it is not a file.

    Args:
        path: the checkpoint path to check.
    """
    if not os.path.isfile(path):
        raise CheckpointNotFoundError(
            f"checkpoint not found: {path} (check MODEL.WEIGHTS or the path you passed; "
            "URLs are not downloaded, fetch the file first)"
        )


def _is_npz(path: str) -> bool:
    """True for a NumPy archive: a zip whose members are all ``.npy`` arrays (a torch.save
    zip holds a ``data.pkl`` instead)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile:  # not a zip: a legacy torch.save file, or not a weights file
        return False
    return bool(names) and all(name.endswith(".npy") for name in names)


def _read_npz(path: str) -> Dict[str, torch.Tensor]:
    """{array name: tensor} of a NumPy archive, without unpickling (object arrays refused)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: torch.from_numpy(np.array(archive[name])) for name in archive.files}
    except Exception as e:  # numpy raises ValueError for object arrays, others for bad members
        raise CorruptCheckpointError(f"{path} is not a readable .npz weights file: {_short_reason(e)}") from None


def _read_checkpoint_file(path: str, allow_unsafe: bool) -> Any:
    """torch.load a file (or read a NumPy archive) on CPU, safely unless `allow_unsafe`;
    one-line errors."""
    require_checkpoint_file(path)
    if _is_npz(path):
        return _read_npz(path)
    try:
        if allow_unsafe:
            return torch.load(path, map_location="cpu", weights_only=False)
        with torch.serialization.safe_globals(safe_load_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for bad files; classify them
        refused = re.findall(r"GLOBAL ([\w.]+)", str(e))
        if refused and all(map(_global_resolves, refused)) and not allow_unsafe:
            raise CheckpointError(
                f"{path} holds Python objects that a safe load refuses ({', '.join(sorted(set(refused)))}): "
                "unpickling them could run arbitrary code; if you trust the file, opt in with "
                f"Checkpointer(..., allow_unsafe_load=True) or the environment variable {UNSAFE_LOAD_ENV}=1"
            ) from None
        raise CorruptCheckpointError(
            f"{path} is not a readable checkpoint (truncated or corrupt, or not written by "
            f"torch.save?): {_short_reason(e)}"
        ) from None


def _is_tensor_like(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _as_checkpoint_dict(path: str, loaded: Any) -> Dict[str, Any]:
    """Bring the layouts we accept to ``{"model": state_dict, **other_entries}``.

    Accepted: ``{"model": sd, ...}`` (ours, fast-reid's, detectron2's),
    ``{"state_dict": sd, ...}`` (torchreid and others), ``{"model_state": sd, ...}``
    (pycls's ImageNet files) and a bare state dict (torchvision's ``.pth`` files).
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
    elif isinstance(checkpoint.get("model_state"), Mapping):
        checkpoint["model"] = checkpoint.pop("model_state")
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
    """Read a weights file without a model: ``{"model": state_dict, **other_entries}``.

    Safe unpickling unless `allow_unsafe_load` or ``REID_ALLOW_UNSAFE_LOAD=1``; accepted
    layouts: ``{"model": sd, ...}``, ``{"state_dict": sd, ...}``, ``{"model_state": sd, ...}``,
    a bare state dict, and a NumPy ``.npz`` archive of arrays (read as a bare state dict).

    Args:
        path: the file.
        allow_unsafe_load: allow files that need full unpickling.

    Returns:
        dict: the normalized checkpoint, tensors on CPU.

    Raises:
        CheckpointNotFoundError: `path` is not a file.
        CorruptCheckpointError: a truncated or damaged file, or one whose content does not
            match the checksum stored in it (files without one are not checked).
        CheckpointError: a file that needs unsafe unpickling, or one without a state dict
            of tensors.
    """
    loaded = _read_checkpoint_file(path, allow_unsafe=_unsafe_load_allowed(allow_unsafe_load))
    _verify_checksum(path, loaded)
    return _as_checkpoint_dict(path, loaded)


def _verify_checksum(path: str, loaded: Any) -> None:
    """Check and drop the checksum entry our checkpoints carry (files without one pass)."""
    expected = stored_checksum(loaded)
    if expected is None:
        return
    if payload_checksum(loaded) != expected:
        raise ChecksumMismatchError(
            f"{path} is corrupt: its content does not match the checksum stored in it (damaged on disk "
            "or in transfer); use another checkpoint or copy the file again")
    loaded.pop(CHECKSUM_KEY)
