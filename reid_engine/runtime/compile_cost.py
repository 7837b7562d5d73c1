"""Whether compiling pays for itself in the iterations a run has left, and what earlier runs measured.

``auto`` compiles a model only when the time compilation saves over the remaining iterations
exceeds what compiling costs: a short run or a fine-tune stays eager. The saving is
``remaining iterations x eager step x (1 - 1 / speedup)``, with the eager step measured by
the run itself (CompileGuard's first steps). The compile cost and the speedup come from an
earlier run of the same recipe on this machine when there is one (the record below), else
from the defaults measured for this project (docs/benchmarks.md, "Compiled training").

The record is a small JSON file beside inductor's cache (``compile_records.json``): one entry
per recipe (the model's structure, input shape, precision, compile mode and scope, device
and torch version) with the compile seconds and the speedup last measured. The compile
seconds of a run that found inductor's cache warm are low, and the next estimate follows them.
"""
import dataclasses
import hashlib
import json
import logging
import os
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ..utils.comm import unwrap_model
from ..utils.file_io import atomic_write_text
from .compile import inductor_cache_dir
from .compiled import compile_record

__all__ = ["CompileEstimate", "DEFAULT_COMPILE_S", "DEFAULT_SPEEDUP", "recipe_key", "estimate", "record",
           "expected_saving", "pays_off", "describe", "records_path"]

logger = logging.getLogger(__name__)

#: cold compile seconds assumed for a recipe never compiled on this machine, by device type
#: (BoT R50 at 256x128 took 44 s on an H100, a strong baseline R50 longer: issue 36)
DEFAULT_COMPILE_S = {"cuda": 60.0, "cpu": 150.0}
#: steady-state speedup over eager assumed without a record (2.79x measured for BoT R50 on an
#: H100 in CUDA graphs; taken lower, so that a doubtful case stays eager)
DEFAULT_SPEEDUP = {"cuda": 2.0, "cpu": 1.0}

_RECORDS = "compile_records.json"


@dataclasses.dataclass(frozen=True)
class CompileEstimate:
    """What compiling a recipe is expected to cost and to gain.

    Attributes:
        compile_s: seconds of compilation (tracing, lowering, code generation, graph capture).
        speedup: eager step time over compiled step time in steady state.
        source: where the figures come from ("an earlier run of this recipe", "defaults ...").
    """

    compile_s: float
    speedup: float
    source: str


def recipe_key(model: nn.Module, device: torch.device, detail: str = "") -> str:
    """A short key naming what a compilation depends on.

    Args:
        model: the model compiled by ``runtime.compile.compile_model`` (DDP-wrapped or not):
            its structure (module tree with every layer's shape) and the mode and scope of its
            compile record are part of the key.
        device: the training device (its name is part of the key: another GPU compiles differently).
        detail: further facts that change the graphs (input shape, batch size, precision).
    Returns:
        a hex digest.
    """
    inner = unwrap_model(model)
    record = compile_record(inner)
    mode, scope = (record.mode, record.scope) if record is not None else ("off", "model")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    text = "\n".join([repr(inner), mode, scope, device_name, torch.__version__, detail])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def records_path() -> str:
    """The record file (beside inductor's cache: ``TORCHINDUCTOR_CACHE_DIR`` or its default here)."""
    return os.path.join(inductor_cache_dir(), _RECORDS)


def _read() -> Dict[str, dict]:
    try:
        with open(records_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # no record yet, or a damaged one: the defaults apply


def estimate(key: str, device_type: str) -> CompileEstimate:
    """The expected compile seconds and speedup of the recipe `key` on a `device_type` device.

    Args:
        key: :func:`recipe_key`.
        device_type: "cuda" or "cpu" (the defaults' key).
    Returns:
        the record of an earlier run of the recipe, or the defaults.
    """
    entry = _read().get(key)
    if entry and entry.get("compile_s") is not None and entry.get("speedup"):
        return CompileEstimate(float(entry["compile_s"]), float(entry["speedup"]),
                               f"measured by an earlier run of this recipe ({entry.get('runs', 1)} so far)")
    return CompileEstimate(DEFAULT_COMPILE_S.get(device_type, DEFAULT_COMPILE_S["cpu"]),
                           DEFAULT_SPEEDUP.get(device_type, 1.0), f"defaults for {device_type}, no earlier run")


def record(key: str, compile_s: float, speedup: float) -> None:
    """Keep what this run measured for the next estimate of the recipe `key` (atomic write; a
    read-only cache folder only costs the record).

    Args:
        key: :func:`recipe_key`.
        compile_s: the measured compile seconds.
        speedup: eager step over compiled step.
    """
    records = _read()
    runs = int(records.get(key, {}).get("runs", 0)) + 1
    records[key] = {"compile_s": round(float(compile_s), 2), "speedup": round(float(speedup), 3), "runs": runs}
    path = records_path()
    try:
        atomic_write_text(path, json.dumps(records, indent=1))
    except OSError as e:  # FileWriteError included: the run goes on without its record
        logger.info("Compile: could not keep the compile record in %s (%s)", path, e)


def expected_saving(eager_step_s: float, remaining_steps: int, speedup: float) -> float:
    """Seconds compiled steps save over `remaining_steps` eager ones at `speedup`.

    Args:
        eager_step_s: the measured eager step.
        remaining_steps: training steps the run has left.
        speedup: the expected speedup (1 or less: no saving).
    Returns:
        the saving (0 when the speedup is not above 1).
    """
    if speedup <= 1.0:
        return 0.0
    return max(0, remaining_steps) * eager_step_s * (1.0 - 1.0 / speedup)


def pays_off(estimate_: CompileEstimate, eager_step_s: float, remaining_steps: int) -> Tuple[bool, float]:
    """Whether compiling saves more than it costs, and the expected saving in seconds."""
    saving = expected_saving(eager_step_s, remaining_steps, estimate_.speedup)
    return saving > estimate_.compile_s, saving


def describe(estimate_: CompileEstimate, eager_step_s: float, remaining_steps: int,
             saving: Optional[float] = None) -> str:
    """One phrase with the figures of the decision, for the log line."""
    saving = expected_saving(eager_step_s, remaining_steps, estimate_.speedup) if saving is None else saving
    return (f"compiling costs about {estimate_.compile_s:.0f} s and saves about {saving:.0f} s over the "
            f"{remaining_steps} iterations left (eager step {eager_step_s:.4f} s, expected speedup "
            f"{estimate_.speedup:.2f}x; {estimate_.source})")
