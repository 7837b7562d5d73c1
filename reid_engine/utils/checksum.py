"""A checksum of a checkpoint's content, stored inside the checkpoint and checked on load.

The digest covers what ``torch.save`` wrote, not the file's bytes: every tensor's dtype,
shape and data, and every key and plain value, walked in the (pickle-preserved) order of
the containers. It is stored as one more top-level entry, ``CHECKSUM_KEY``, a short
string: fast-reid's and fvcore's loaders hand such extra entries back untouched, and a
safe (weights-only) load reads it. A file without the entry (older files, fast-reid's)
simply has nothing to check.
"""
import hashlib
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["CHECKSUM_KEY", "payload_checksum", "stored_checksum"]

CHECKSUM_KEY = "checksum"
_PREFIX = "sha256:"


def _update_tensor(h: "hashlib._Hash", t: torch.Tensor) -> None:
    h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        return  # rare layouts: their metadata only
    data = t.detach().cpu().contiguous().reshape(-1)
    h.update(data.view(torch.uint8).numpy() if data.numel() else b"")


def _update(h: "hashlib._Hash", value: Any) -> None:
    """Feed `value` to `h` with a type tag, so that e.g. 1 and "1" differ."""
    if isinstance(value, torch.Tensor):
        _update_tensor(h, value)
    elif isinstance(value, np.ndarray):
        if value.dtype == object:
            h.update(b"O")
            _update(h, value.tolist())
        else:
            h.update(f"A{value.dtype.str}{value.shape}".encode())
            h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, np.generic):
        h.update(f"N{value.dtype.str}".encode() + value.tobytes())
    elif isinstance(value, Mapping):
        h.update(f"D{len(value)}".encode())
        for key, item in value.items():
            _update(h, key)
            _update(h, item)
    elif isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__[0]}{len(value)}".encode())
        for item in value:
            _update(h, item)
    elif isinstance(value, (set, frozenset)):  # iteration order varies with the string hash seed
        h.update(f"S{len(value)}".encode())
        for item in sorted(value, key=repr):
            _update(h, item)
    elif isinstance(value, bytes):
        h.update(b"B%d:" % len(value) + value)
    elif value is None or isinstance(value, (bool, int, float, str, complex, torch.dtype, torch.device, torch.Size)):
        text = repr(value) if not isinstance(value, (torch.dtype, torch.device)) else str(value)
        h.update(f"{type(value).__name__}:{len(text)}:{text}".encode())
    else:  # another object (unsafe loads only): its repr may hold an address, so only its type counts
        h.update(f"?{type(value).__module__}.{type(value).__qualname__}".encode())


def payload_checksum(checkpoint: Mapping) -> str:
    """The checksum of a checkpoint dict, without its own ``CHECKSUM_KEY`` entry.

    Args:
        checkpoint: the dict given to ``torch.save`` (or returned by ``torch.load``).

    Returns:
        str: ``"sha256:<64 hex digits>"``.
    """
    h = hashlib.sha256()
    _update(h, {k: v for k, v in checkpoint.items() if k != CHECKSUM_KEY})
    return _PREFIX + h.hexdigest()


def stored_checksum(checkpoint: Any) -> Optional[str]:
    """The checksum a loaded checkpoint carries, or None when it has none of ours.

    Args:
        checkpoint: what ``torch.load`` returned.
    """
    if not isinstance(checkpoint, Mapping):
        return None
    value = checkpoint.get(CHECKSUM_KEY)
    return value if isinstance(value, str) and value.startswith(_PREFIX) else None
