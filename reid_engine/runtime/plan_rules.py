"""The decision rules of the run plan, as plain functions of config values and the machine.

``runtime.run_plan`` applies them to one config, once per process; these functions are the one
place each rule lives (the compile mode and its purposes, channels_last, mixed precision, where
the batched augmentations run, the loader workers). Machine facts come from ``utils.env``
(read through the module, so a test can stand in for the machine in one place).
"""
import dataclasses
import logging
import os
from typing import List, Mapping, Optional, Tuple, Union

import torch

from ..utils import env
from ..utils.errors import ConfigError
from ..utils.registry import check_choice
from . import thread_policy
from .cpu_budget import usable_cpus

__all__ = [
    "PURPOSES", "COMPILE_MODES", "COMPILE_BACKENDS", "COMPILE_SCOPES", "normalize_compile_mode",
    "resolve_compile_mode", "compile_decision", "compile_scope_decision", "freezes_layers",
    "CHANNELS_LAST_CHOICES", "use_channels_last",
    "AMP_DTYPE_NAMES", "resolve_amp_dtype", "AmpDecision", "amp_decision",
    "DEVICE_AUGMENT_CHOICES", "batched_op_names", "reordered_keys", "device_augment_decision",
    "loader_workers", "cpu_threads", "adapts_threads",
]


# ---------------------------------------------------------------------------- compilation
COMPILE_MODES = ("auto", "off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Older files wrote MODEL.COMPILE True / False (the config turns YAML booleans into on / off).
_COMPILE_ALIASES = {"on": "default", "true": "default", "false": "off"}
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
#: MODEL.COMPILE_SCOPE values: what torch.compile compiles (runtime.compile.compile_model)
COMPILE_SCOPES = ("auto", "model", "blocks")

#: what the plan is for: ``train`` (auto compiles where it pays, under the trainer's guard),
#: ``evaluate`` (a test pass: auto stays eager, an explicit mode is kept) or ``serve``
#: (a served or exported model: always eager)
PURPOSES = ("train", "evaluate", "serve")


def normalize_compile_mode(value) -> str:
    """The canonical MODEL.COMPILE mode of a config value (aliases resolved).

    Args:
        value: the config value (a mode name, on / off, True / False).
    Returns:
        one of COMPILE_MODES.
    Raises:
        UnknownChoiceError: not a mode (one line with the choices and the closest).
    """
    text = str(value).strip().lower()
    return check_choice(_COMPILE_ALIASES.get(text, text), COMPILE_MODES, "MODEL.COMPILE")


def resolve_compile_mode(value, device: torch.device, model=None, eager_only_reason: Optional[str] = None,
                         ) -> Tuple[str, str]:
    """The mode a training run compiles with, and why (for one log line).

    ``auto``: reduce-overhead (CUDA graphs) for CUDA training, unless the architecture is
    eager-only; eager on the CPU, where compiling the main job bought no speed in the
    trainer loop (docs/benchmarks.md, "Compiled training") and costs a C++ build.

    Args:
        value: MODEL.COMPILE.
        device: the training device.
        model: a model or architecture class whose ``EAGER_ONLY_REASON`` is read, or None.
        eager_only_reason: the architecture's reason to stay eager under auto (instead of `model`).
    Returns:
        (mode, reason): mode is "off" or a torch.compile mode.
    """
    mode = normalize_compile_mode(value)
    if mode != "auto":
        return mode, f"MODEL.COMPILE {value}"
    arch = model if isinstance(model, type) or model is None else type(model)
    eager_only = eager_only_reason or (getattr(arch, "EAGER_ONLY_REASON", None) if arch is not None else None)
    if eager_only:
        name = arch.__name__ if arch is not None else "the architecture"
        return "off", f"auto: {name} trains eager ({eager_only})"
    if device.type == "cuda":
        return "reduce-overhead", "auto: CUDA training runs in CUDA graphs (reduce-overhead)"
    return "off", f"auto: eager on {device.type} (compiling was not faster there)"


def compile_decision(purpose: str, value, device: torch.device, architecture=None) -> Tuple[str, str]:
    """The compile mode of a run for `purpose`, and why.

    Args:
        purpose: "train" (:func:`resolve_compile_mode`), "evaluate" (auto stays eager, an explicit
            mode is kept) or "serve" (always eager).
        value: MODEL.COMPILE.
        device: the run's device.
        architecture: the meta-architecture class (its EAGER_ONLY_REASON is read), or None.
    Returns:
        (mode, reason): mode is "off" or a torch.compile mode.
    """
    if purpose == "serve":
        # Exporters trace this model (torch.onnx, TorchScript), which must not run through torch.compile,
        # and a served model's calls come one batch at a time, of any size.
        return "off", "serving or export: the model runs eager"
    if purpose == "evaluate" and normalize_compile_mode(value) == "auto":
        # auto chooses for training, where its guard can fall back; a single evaluation pass would
        # pay the compilation without that guard.
        return "off", "auto: an evaluation pass runs eager"
    return resolve_compile_mode(value, device, architecture)


def freezes_layers(cfg) -> bool:
    """Whether the run starts with frozen layers: SOLVER.FREEZE_ITERS with MODEL.FREEZE_LAYERS
    (the trainer then adds its LayerFreeze hook, and ``auto`` compiles blocks)."""
    return cfg.SOLVER.FREEZE_ITERS > 0 and len(cfg.MODEL.FREEZE_LAYERS) > 0


def compile_scope_decision(value, mode: str, freezes: bool = False) -> Tuple[str, str]:
    """What a compiled run compiles (MODEL.COMPILE_SCOPE), and why.

    ``auto`` compiles the whole model, the fastest in steady state (BoT R50 on an H100: 2.62x
    eager against 2.04x for its blocks, with 38 s of compilation against 30 s), except for a run
    that freezes layers first: releasing them changes their BatchNorm from eval to train mode,
    which recompiles what contains them. Compiled whole, the strong baseline (sbs_R50) did not
    finish 2 epochs in 5 minutes on an H100; in blocks it compiled in 36 s, recompiled the
    released blocks in 32 s, and trained at 1.71x eager (docs/benchmarks.md, "Compiled training"). (With
    its cost rule, ``auto`` now usually trains a short freeze eager and compiles once, at the
    release: runtime/compile_guard.py. The frozen model is still compiled, and released,
    under a long freeze, an explicit mode or MODEL.COMPILE_WEIGH_COST off.)

    Args:
        value: MODEL.COMPILE_SCOPE.
        mode: the run's compile mode ("off": nothing is compiled).
        freezes: the run freezes layers at its start (SOLVER.FREEZE_ITERS with MODEL.FREEZE_LAYERS).
    Returns:
        (scope, reason): scope is "model" or "blocks" ("model" when nothing is compiled).
    Raises:
        UnknownChoiceError: not a scope.
    """
    scope = check_choice(str(value).strip().lower(), COMPILE_SCOPES, "MODEL.COMPILE_SCOPE")
    if mode == "off":
        return "model", "nothing is compiled"
    if scope != "auto":
        return scope, f"MODEL.COMPILE_SCOPE {value}"
    if freezes:
        return "blocks", ("auto: the repeated blocks (releasing the frozen layers recompiles only the blocks "
                          "that contain them)")
    return "model", "auto: the whole model (the fastest compiled step)"


# ---------------------------------------------------------------------------- memory format
CHANNELS_LAST_CHOICES = ("auto", "on", "off")


def use_channels_last(setting: str, device: torch.device, cpu_bf16: bool = False) -> bool:
    """Whether MODEL.CHANNELS_LAST turns the channels_last memory format on for `device`.

    Args:
        setting: "auto" (on for CUDA, where convolutions are faster in it; on the CPU only with
            ``cpu_bf16``: oneDNN's bfloat16 kernels work in that layout, and the stem's max
            pooling is several times faster in it; float32 CPU training stays contiguous),
            "on" or "off".
        device: the model's device.
        cpu_bf16: the model trains under bfloat16 autocast on a CPU that computes it natively
            (SOLVER.AMP.ENABLED on such a CPU).
    """
    check_choice(setting, CHANNELS_LAST_CHOICES, "MODEL.CHANNELS_LAST")
    if setting != "auto":
        return setting == "on"
    return device.type == "cuda" or (device.type == "cpu" and cpu_bf16)


# ---------------------------------------------------------------------------- precision
_PRECISIONS = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
               "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
#: the values SOLVER.AMP.DTYPE accepts
AMP_DTYPE_NAMES = ("auto",) + tuple(_PRECISIONS)


def resolve_amp_dtype(dtype: Union[str, torch.dtype], device_type: str) -> torch.dtype:
    """The autocast dtype for SOLVER.AMP.DTYPE on a device type.

    Args:
        dtype: "auto" (bfloat16 on the CPU and on CUDA devices of compute capability 8 or
            more, else float16; on CPUs without native bfloat16 :func:`amp_decision` skips
            autocast), a name (bfloat16, bf16, float16, fp16, half) or a torch dtype.
        device_type: "cpu" or "cuda".

    Returns:
        torch.bfloat16 or torch.float16.
    """
    if isinstance(dtype, torch.dtype) and dtype in (torch.float16, torch.bfloat16):
        return dtype
    if isinstance(dtype, str) and dtype.lower() == "auto":
        if device_type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
            return torch.float16
        return torch.bfloat16
    if isinstance(dtype, str) and dtype.lower() in _PRECISIONS:
        return _PRECISIONS[dtype.lower()]
    raise ValueError(f"unsupported AMP dtype {dtype!r}: use auto, bfloat16 or float16 (SOLVER.AMP.DTYPE)")


@dataclasses.dataclass(frozen=True)
class AmpDecision:
    """Mixed precision on one device: what the steps autocast to, and the log lines that explain it.

    Attributes:
        dtype: the autocast dtype (bfloat16 or float16), also when autocast is off.
        autocast: whether the forward pass runs under autocast.
        grad_scaling: float16 gradients are scaled (bfloat16 needs no scaling).
        notes: (logging level, message) pairs, logged by the trainer that applies the decision.
    """

    dtype: torch.dtype
    autocast: bool
    grad_scaling: bool
    notes: Tuple[Tuple[int, str], ...] = ()

    @property
    def autocast_dtype(self) -> Optional[torch.dtype]:
        """The dtype the steps autocast to, None when they run in float32."""
        return self.dtype if self.autocast else None


def amp_decision(precision: Union[str, torch.dtype], device_type: str) -> AmpDecision:
    """How automatic mixed precision runs on `device_type` for SOLVER.AMP.DTYPE `precision`.

    On the CPU only bfloat16 is used, and with precision "auto" only where the CPU computes it
    natively (AVX512-BF16 or AMX): elsewhere autocast would be emulated and much slower than
    float32, so the steps run in float32 and a note says so.

    Args:
        precision: torch.float16 or torch.bfloat16, their names, or "auto" (see resolve_amp_dtype).
        device_type: "cpu" or "cuda".
    Returns:
        the decision, with its log lines as notes.
    """
    dtype = resolve_amp_dtype(precision, device_type)
    notes: List[Tuple[int, str]] = []
    autocast = True
    if device_type == "cpu":
        if dtype == torch.float16:
            notes.append((logging.WARNING, "AMP float16 is not used on CPU: using bfloat16 autocast instead"))
            dtype = torch.bfloat16
        native = env.cpu_native_bf16()
        if native:
            notes.append((logging.INFO, f"AMP: this CPU computes bfloat16 natively ({native})"))
        elif isinstance(precision, str) and precision.lower() == "auto":
            notes.append((logging.WARNING, "AMP: this CPU has no native bfloat16 (no AVX512-BF16 or AMX), where "
                          "bfloat16 autocast is emulated and many times slower than float32: training runs in "
                          "float32 (SOLVER.AMP.DTYPE bfloat16 forces autocast)"))
            autocast = False
        else:
            notes.append((logging.WARNING, "AMP: this CPU has no native bfloat16 (no AVX512-BF16 or AMX): bfloat16 "
                          "autocast is emulated and many times slower than float32 (SOLVER.AMP.DTYPE auto avoids it)"))
    if autocast:
        notes.append((logging.INFO, "AMP: autocast to {} on {}{}".format(
            str(dtype).replace("torch.", ""), device_type,
            " with gradient scaling" if dtype == torch.float16 else "")))
    return AmpDecision(dtype, autocast, dtype == torch.float16, tuple(notes))


# ---------------------------------------------------------------------------- augmentation
#: INPUT.DEVICE_AUGMENT values
DEVICE_AUGMENT_CHOICES = ("auto", "on", "off")
#: per-image ops that come after pad-crop / flip and before random patch's batch op: with
#: INPUT.DEVICE_AUGMENT on they would run before the moved ops, so ``auto`` keeps those per image
_REORDERED = ("CJ", "AFFINE", "AUGMIX", "RPT")


def batched_op_names(cfg) -> Tuple[str, ...]:
    """The enabled ops INPUT.DEVICE_AUGMENT moves: a subset of ("pad-crop", "flip", "erasing")."""
    inp = cfg.INPUT
    return tuple(name for name, on in (("pad-crop", inp.PADDING.ENABLED), ("flip", inp.FLIP.ENABLED),
                                       ("erasing", inp.REA.ENABLED)) if on)


def reordered_keys(cfg) -> Tuple[str, ...]:
    """The enabled INPUT ops that would run before the moved ops instead of after them."""
    return tuple(f"INPUT.{key}" for key in _REORDERED if cfg.INPUT[key].ENABLED)


def device_augment_decision(cfg, device_type: str) -> Tuple[bool, str]:
    """Whether pad-crop, flip and random erasing run batched on the device (INPUT.DEVICE_AUGMENT), and why.

    ``auto`` turns it on for CUDA training unless INPUT.CJ / AFFINE / AUGMIX / RPT is enabled
    (they would then run before the moved ops instead of after them); on the CPU the
    per-image path stays (the batched ops measured no faster there: the loader figures on docs/benchmarks.md).

    Args:
        cfg: the config (INPUT.*).
        device_type: the training device's type ("cpu" or "cuda").
    Returns:
        (enabled, reason).
    Raises:
        UnknownChoiceError: INPUT.DEVICE_AUGMENT is not auto, on or off.
    """
    mode = check_choice(cfg.INPUT.DEVICE_AUGMENT, DEVICE_AUGMENT_CHOICES, "INPUT.DEVICE_AUGMENT")
    if not batched_op_names(cfg):
        return False, "no pad-crop, flip or erasing to move"
    if mode != "auto":
        return mode == "on", f"INPUT.DEVICE_AUGMENT {mode}"
    if device_type != "cuda":
        return False, f"INPUT.DEVICE_AUGMENT auto: on {device_type} the batched ops are no faster"
    if reordered_keys(cfg):
        return False, f"INPUT.DEVICE_AUGMENT auto: {', '.join(reordered_keys(cfg))} must run after them"
    return True, "INPUT.DEVICE_AUGMENT auto"


# ---------------------------------------------------------------------------- loading
def loader_workers(cfg) -> int:
    """The data-loader worker processes of every loader of the run (DATALOADER.NUM_WORKERS).

    Args:
        cfg: the config.
    Returns:
        the worker count (0: load in the training process).
    Raises:
        ConfigError: a negative count.
    """
    workers = int(cfg.DATALOADER.NUM_WORKERS)
    if workers < 0:
        raise ConfigError(f"DATALOADER.NUM_WORKERS must be >= 0, got {workers}")
    return workers


# ---------------------------------------------------------------------------- threads
def cpu_threads(local_workers: int = 1, environ: Optional[Mapping[str, str]] = None,
                usable: Optional[Tuple[int, str]] = None) -> Tuple[int, str]:
    """The intra-op threads of each training or inference process on this machine, and why.

    torch's default is the host's physical cores, whatever the process may use: in a
    container with a CPU quota, on a pinned process, or with several worker processes per
    machine, more compute threads than CPUs wait for each other at every parallel region.
    Here: the CPUs this process may use (affinity, cgroup quota), less those other processes
    kept busy when the command started (``runtime.thread_policy``), shared by the machine's
    training processes; OMP_NUM_THREADS, when set, is the user's override.

    Args:
        local_workers: training processes on this machine (``comm.get_local_size()``).
        environ: the environment (default: os.environ).
        usable: (cpus, source) of ``runtime.cpu_budget.usable_cpus`` (default: read them).
    Returns:
        (threads, reason).
    """
    environ = os.environ if environ is None else environ
    override = environ.get("OMP_NUM_THREADS", "").strip()
    if override.isdigit() and int(override) > 0:
        return int(override), f"OMP_NUM_THREADS {override}"
    cpus, source = usable_cpus() if usable is None else usable
    busy = thread_policy.busy_measured(environ)
    free = thread_policy.threads_left(cpus, busy)
    if free < cpus:
        source += f", {busy:.1f} busy with other processes at start"
    local_workers = max(1, int(local_workers))
    threads = max(1, free // local_workers)
    shared = f" shared by {local_workers} processes" if local_workers > 1 else ""
    return threads, f"{source}{shared} (OMP_NUM_THREADS overrides)"


def adapts_threads(device_type: str, purpose: str, environ: Optional[Mapping[str, str]] = None,
                   usable: Optional[Tuple[int, str]] = None) -> Tuple[bool, str]:
    """Whether training follows other processes' load with its thread count (``ThreadBudget``), and why."""
    environ = os.environ if environ is None else environ
    if device_type != "cpu" or purpose != "train":
        return False, "CPU training only"
    if environ.get("OMP_NUM_THREADS", "").strip():
        return False, "OMP_NUM_THREADS fixes the threads"
    source = (usable_cpus() if usable is None else usable)[1]
    if source.startswith("cgroup"):
        return False, "a cgroup quota hides the neighbours' share"
    if not os.path.exists("/proc/stat"):
        return False, "no /proc/stat to measure the load"
    return True, "other processes' load, sampled every 2 s (OMP_NUM_THREADS fixes the threads)"
