"""The run plan: how this process runs a config on this machine, decided once.

One small object decides, from the config and the machine: the device, the autocast dtype and
gradient scaling, channels_last, the compile mode (explicit or ``auto``, with the reason), the
CPU bfloat16 weight-gradient path, device-side augmentation and the loader's worker count.
Model building, the trainer, the compile guard, inference and export read the plan; none of
them reads these config keys itself. :func:`build_run_plan` memoises the plan per config and
purpose, so each process decides (and logs its table) once.

The decision rules live here as plain functions (:func:`normalize_compile_mode`,
:func:`resolve_compile_mode`, :func:`use_channels_last`, :func:`amp_decision`,
:func:`device_augment_decision`); the plan only applies them to one config.
"""
import dataclasses
import logging
from typing import Dict, List, Optional, Tuple, Union

import torch
from tabulate import tabulate

from ..utils.env import cpu_native_bf16, resolve_device
from ..utils.registry import check_choice, registry_for_key
from .config import ConfigError

__all__ = [
    "RunPlan", "AmpDecision", "build_run_plan", "check_plan_config", "PURPOSES",
    "COMPILE_MODES", "COMPILE_BACKENDS", "normalize_compile_mode", "resolve_compile_mode", "compile_decision",
    "CHANNELS_LAST_CHOICES", "use_channels_last",
    "AMP_DTYPE_NAMES", "resolve_amp_dtype", "amp_decision",
    "DEVICE_AUGMENT_CHOICES", "batched_op_names", "reordered_keys", "device_augment_decision",
    "loader_workers",
]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- compilation
COMPILE_MODES = ("auto", "off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Older files wrote MODEL.COMPILE True / False (the config turns YAML booleans into on / off).
_COMPILE_ALIASES = {"on": "default", "true": "default", "false": "off"}
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")

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
    trainer loop (README, "Compiled training") and costs a C++ build.

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
        native = cpu_native_bf16()
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
    per-image path stays (the batched ops measured no faster there: the README's loader figures).

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


# ---------------------------------------------------------------------------- the plan
@dataclasses.dataclass(frozen=True)
class RunPlan:
    """How this process runs a config: every device, precision and compilation decision, with its reason.

    Build it with :func:`build_run_plan`. Attributes are plain values; ``reasons`` maps a
    decision's name (a field name) to the one phrase that explains it.
    """

    purpose: str
    device: torch.device
    amp: Optional[AmpDecision]
    channels_last: bool
    compile_mode: str
    compile_explicit: bool
    compile_backend: str
    cpu_bf16_weight_grad: bool
    device_augment: bool
    loader_workers: int
    reasons: Dict[str, str] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def autocast_dtype(self) -> Optional[torch.dtype]:
        """The dtype the training steps autocast to, None for float32 steps."""
        return self.amp.autocast_dtype if self.amp is not None else None

    @property
    def grad_scaling(self) -> bool:
        """Whether float16 gradients are scaled."""
        return bool(self.amp is not None and self.amp.autocast and self.amp.grad_scaling)

    @property
    def compiled(self) -> bool:
        """Whether the model is compiled (torch.compile) for this run."""
        return self.compile_mode != "off"

    def rows(self) -> List[Tuple[str, str, str]]:
        """(decision, choice, why) rows of the plan's table."""
        precision = str(self.autocast_dtype).replace("torch.", "") + " autocast" if self.autocast_dtype else "float32"
        compile_text = "eager" if self.compile_mode == "off" else f"{self.compile_mode} ({self.compile_backend})"
        on_off = {True: "on", False: "off"}
        r = self.reasons
        return [
            ("device", str(self.device), r.get("device", "")),
            ("precision", precision, r.get("amp", "")),
            ("gradient scaling", on_off[self.grad_scaling], "float16 only" if self.grad_scaling else ""),
            ("channels_last", on_off[self.channels_last], r.get("channels_last", "")),
            ("compile", compile_text, r.get("compile_mode", "")),
            ("CPU bf16 weight gradients", on_off[self.cpu_bf16_weight_grad], r.get("cpu_bf16_weight_grad", "")),
            ("device augmentation", on_off[self.device_augment], r.get("device_augment", "")),
            ("loader workers", str(self.loader_workers), r.get("loader_workers", "")),
        ]

    def table(self) -> str:
        """The plan as a text table (decision, choice, why), for the log."""
        return tabulate(self.rows(), headers=["decision", "choice", "why"], tablefmt="pipe")

    def log(self) -> None:
        """Log the plan's table (INFO)."""
        logger.info("Run plan (%s):\n%s", self.purpose, self.table())


def check_plan_config(cfg) -> None:
    """Check the plan's enumerated keys without deciding anything (no device is resolved).

    Args:
        cfg: the config (MODEL.CHANNELS_LAST, MODEL.COMPILE, MODEL.COMPILE_BACKEND, SOLVER.AMP.DTYPE,
            DATALOADER.NUM_WORKERS).
    Raises:
        UnknownChoiceError, ConfigError: the first wrong value (one line: key, choices, closest).
    """
    check_choice(cfg.MODEL.CHANNELS_LAST, CHANNELS_LAST_CHOICES, "MODEL.CHANNELS_LAST")
    normalize_compile_mode(cfg.MODEL.COMPILE)
    check_choice(cfg.MODEL.COMPILE_BACKEND, COMPILE_BACKENDS, "MODEL.COMPILE_BACKEND")
    check_choice(cfg.SOLVER.AMP.DTYPE, AMP_DTYPE_NAMES, "SOLVER.AMP.DTYPE")
    loader_workers(cfg)


def _architecture(name: str):
    """The meta-architecture class MODEL.META_ARCHITECTURE names, when the registry is loaded (else None)."""
    registry = registry_for_key("MODEL.META_ARCHITECTURE")
    return registry.get(name) if registry is not None and name in registry.names() else None


def _device_reason(setting) -> str:
    text = str(setting).strip().lower()
    if text == "auto":
        return "MODEL.DEVICE auto: " + ("a CUDA device is visible" if torch.cuda.is_available() else "no CUDA device")
    return f"MODEL.DEVICE {setting}"


def _plan(cfg, purpose: str, architecture) -> RunPlan:
    """Decide the plan of `cfg` for `purpose` (see :func:`build_run_plan`)."""
    check_choice(purpose, PURPOSES, "purpose")
    device = resolve_device(cfg.MODEL.DEVICE)
    reasons = {"device": _device_reason(cfg.MODEL.DEVICE)}
    amp = amp_decision(cfg.SOLVER.AMP.DTYPE, device.type) if cfg.SOLVER.AMP.ENABLED else None
    reasons["amp"] = "SOLVER.AMP.ENABLED off" if amp is None else (
        f"SOLVER.AMP.DTYPE {cfg.SOLVER.AMP.DTYPE}" if amp.autocast else "no native bfloat16 on this CPU")
    # oneDNN's bfloat16 weight gradient is slow on small maps (layers.cpu_bf16_conv): on a CPU that
    # computes bfloat16 natively, AMP training uses the matrix-product weight gradient there.
    cpu_bf16 = bool(device.type == "cpu" and cfg.SOLVER.AMP.ENABLED and cpu_native_bf16())
    reasons["cpu_bf16_weight_grad"] = ("native bfloat16 AMP on the CPU: matrix-product weight gradients on "
                                       "small maps" if cpu_bf16 else "only for bfloat16 AMP on a native-bf16 CPU")
    channels_last = use_channels_last(cfg.MODEL.CHANNELS_LAST, device, cpu_bf16=cpu_bf16)
    reasons["channels_last"] = f"MODEL.CHANNELS_LAST {cfg.MODEL.CHANNELS_LAST}"
    check_choice(cfg.MODEL.COMPILE_BACKEND, COMPILE_BACKENDS, "MODEL.COMPILE_BACKEND")
    mode, reasons["compile_mode"] = compile_decision(purpose, cfg.MODEL.COMPILE, device, architecture)
    augment, reasons["device_augment"] = device_augment_decision(cfg, device.type)
    workers = loader_workers(cfg)
    reasons["loader_workers"] = "DATALOADER.NUM_WORKERS"
    return RunPlan(purpose=purpose, device=device, amp=amp, channels_last=channels_last, compile_mode=mode,
                   compile_explicit=normalize_compile_mode(cfg.MODEL.COMPILE) != "auto",
                   compile_backend=str(cfg.MODEL.COMPILE_BACKEND), cpu_bf16_weight_grad=cpu_bf16,
                   device_augment=augment, loader_workers=workers, reasons=reasons)


# Plans already decided in this process, by the config values they read: the same config
# is planned (and its table logged) once.
_PLANS: Dict[tuple, RunPlan] = {}
_LOGGED: set = set()
_MAX_PLANS = 16


def _plan_key(cfg, purpose: str, architecture) -> tuple:
    inp = cfg.INPUT
    machine = (torch.cuda.is_available(), cpu_native_bf16())  # constant in a process, but tests stand in for it
    return (purpose, architecture, machine, str(cfg.MODEL.DEVICE), bool(cfg.SOLVER.AMP.ENABLED), str(cfg.SOLVER.AMP.DTYPE),
            str(cfg.MODEL.CHANNELS_LAST), str(cfg.MODEL.COMPILE), str(cfg.MODEL.COMPILE_BACKEND),
            str(inp.DEVICE_AUGMENT), batched_op_names(cfg), reordered_keys(cfg), int(cfg.DATALOADER.NUM_WORKERS))


def build_run_plan(cfg, purpose: str = "train", log: bool = True) -> RunPlan:
    """The run plan of `cfg` in this process (decided once per config and purpose, then reused).

    Args:
        cfg: the config (MODEL.DEVICE, SOLVER.AMP.*, MODEL.CHANNELS_LAST, MODEL.COMPILE,
            MODEL.COMPILE_BACKEND, INPUT.DEVICE_AUGMENT and the INPUT ops it moves,
            DATALOADER.NUM_WORKERS; MODEL.META_ARCHITECTURE for its EAGER_ONLY_REASON).
        purpose: "train", "evaluate" or "serve" (see PURPOSES).
        log: log the plan's table the first time it is decided.
    Returns:
        the plan.
    Raises:
        UnknownChoiceError, InvalidDeviceError, DeviceUnavailableError: a wrong or unusable value.
    """
    architecture = _architecture(cfg.MODEL.META_ARCHITECTURE)
    key = _plan_key(cfg, purpose, architecture)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(cfg, purpose, architecture)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = plan
    if log and key not in _LOGGED:
        _LOGGED.add(key)
        plan.log()
    return plan
