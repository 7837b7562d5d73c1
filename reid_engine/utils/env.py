"""Random-number-generator seeding and state capture, and device resolution."""

import logging
import os
import random
import re
from typing import Optional, Union

import numpy as np
import torch

from .errors import DeviceUnavailableError, InvalidDeviceError

__all__ = ["seed_all_rng", "get_rng_states", "set_rng_states", "resolve_device", "cpu_native_bf16"]

logger = logging.getLogger(__name__)


def seed_all_rng(seed: Optional[int] = None) -> int:
    """Seed python ``random``, numpy and torch (all devices).

    Args:
        seed: the seed; None or negative draws a random one (logged so a run can be
            repeated).

    Returns:
        The seed used.
    """
    if seed is None or seed < 0:
        seed = int.from_bytes(os.urandom(4), "big") & 0x7FFFFFFF
        logger.info(f"Using a generated random seed {seed}")
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy only takes 32-bit seeds
    torch.manual_seed(seed)
    return seed


def get_rng_states() -> dict:
    """Capture the state of every RNG: python ``random``, numpy, torch CPU and each
    CUDA device (when available).

    Returns:
        A dict of lists, ints, floats, strings and tensors only, so it survives
        ``torch.save`` / ``torch.load(weights_only=True)``.
    """
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    states = {
        "python": [version, list(internal), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                  float(cached_gaussian)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = list(torch.cuda.get_rng_state_all())
    return states


def set_rng_states(states: dict) -> None:
    """Restore RNG states captured by :func:`get_rng_states`.

    CUDA states are restored only when CUDA is available (and for at most as many
    devices as are visible); a checkpoint made on a GPU machine thus loads on a CPU one.
    """
    version, internal, gauss = states["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    name, keys, pos, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((str(name), np.asarray(keys, dtype=np.int64).astype(np.uint32),
                         int(pos), int(has_gauss), float(cached_gaussian)))
    torch.set_rng_state(states["torch"].cpu())
    cuda_states = states.get("cuda")
    if cuda_states and torch.cuda.is_available():
        count = min(len(cuda_states), torch.cuda.device_count())
        if count < len(cuda_states):
            logger.warning(f"RNG states saved for {len(cuda_states)} CUDA devices, "
                           f"{count} visible: restoring the first {count}")
        for device, state in enumerate(cuda_states[:count]):
            torch.cuda.set_rng_state(state.cpu(), device)


_CUDA_DEVICE_RE = re.compile(r"^cuda(:(\d+))?$")


def resolve_device(name: Union[str, torch.device]) -> torch.device:
    """Turn a MODEL.DEVICE value into a ``torch.device``.

    Args:
        name: "auto" (CUDA if available, else CPU), "cpu", "cuda" or "cuda:N".

    Returns:
        The device.

    Raises:
        RuntimeError: CUDA is requested but unavailable (or N is out of range).
        ValueError: the name is not one of the above.
    """
    text = str(name).strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = _CUDA_DEVICE_RE.match(text)
    if match is None:
        raise InvalidDeviceError(f"unknown device '{name}': set MODEL.DEVICE to auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(f"device '{name}' requested but CUDA is not available: set MODEL.DEVICE cpu (or auto)")
    index = match.group(2)
    if index is not None and int(index) >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"device '{name}' requested but only {torch.cuda.device_count()} CUDA device(s) are visible: "
            f"set MODEL.DEVICE to cuda:0..cuda:{torch.cuda.device_count() - 1} or auto"
        )
    return torch.device(text)


def cpu_native_bf16() -> str:
    """The CPU instruction set that computes bfloat16 natively, or "" when there is none.

    Without AVX512-BF16 or AMX, bfloat16 convolutions and matrix products are emulated and run
    many times slower than float32 (a ResNet-18 training step here: about 30x).

    Returns:
        "AMX", "AVX512-BF16" or "".
    """
    cpu = torch.cpu
    if getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        return "AMX"
    if getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "AVX512-BF16"
    return ""
