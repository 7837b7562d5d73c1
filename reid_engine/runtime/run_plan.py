"""The run plan: how this process runs a config on this machine, decided once.

One small object decides, from the config and the machine: the device, the autocast dtype and
gradient scaling, channels_last, the compile mode (explicit or ``auto``, with the reason), the
CPU bfloat16 weight-gradient path, device-side augmentation, the loader's worker count and the
intra-op CPU threads.
Model building, the trainer, the compile guard, inference and export read the plan; none of
them reads these config keys itself. :func:`build_run_plan` memoises the plan per config and
purpose, so each process decides (and logs its table) once.

The decision rules are plain functions in ``runtime.plan_rules`` (re-exported here:
:func:`compile_decision`, :func:`use_channels_last`, :func:`amp_decision`,
:func:`device_augment_decision`, :func:`loader_workers`); the plan only applies them to one config.
"""
import dataclasses
import logging
import os
from typing import Dict, List, Optional, Tuple

import torch
from tabulate import tabulate

from ..utils import comm, env
from ..utils.registry import check_choice, registry_for_key
from . import thread_policy
from .cpu_budget import usable_cpus
from .plan_rules import (
    AMP_DTYPE_NAMES,
    CHANNELS_LAST_CHOICES,
    COMPILE_BACKENDS,
    COMPILE_MODES,
    COMPILE_SCOPES,
    DEVICE_AUGMENT_CHOICES,
    PURPOSES,
    AmpDecision,
    adapts_threads,
    amp_decision,
    batched_op_names,
    compile_decision,
    compile_scope_decision,
    cpu_threads,
    device_augment_decision,
    freezes_layers,
    loader_workers,
    normalize_compile_mode,
    reordered_keys,
    resolve_amp_dtype,
    resolve_compile_mode,
    use_channels_last,
)

__all__ = [
    "RunPlan", "AmpDecision", "build_run_plan", "check_plan_config", "PURPOSES",
    "COMPILE_MODES", "COMPILE_BACKENDS", "COMPILE_SCOPES", "normalize_compile_mode", "resolve_compile_mode",
    "compile_decision", "compile_scope_decision",
    "CHANNELS_LAST_CHOICES", "use_channels_last",
    "AMP_DTYPE_NAMES", "resolve_amp_dtype", "amp_decision",
    "DEVICE_AUGMENT_CHOICES", "batched_op_names", "reordered_keys", "device_augment_decision",
    "freezes_layers", "loader_workers",
]

logger = logging.getLogger(__name__)

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
    threads: int = 1
    adapt_threads: bool = False
    compile_scope: str = "model"
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
        compile_text = "eager" if self.compile_mode == "off" else \
            f"{self.compile_mode} ({self.compile_backend}, {self.compile_scope})"
        on_off = {True: "on", False: "off"}
        r = self.reasons
        compile_why = r.get("compile_mode", "") + (f"; {r['compile_scope']}" if self.compiled and "compile_scope" in r else "")
        return [
            ("device", str(self.device), r.get("device", "")),
            ("precision", precision, r.get("amp", "")),
            ("gradient scaling", on_off[self.grad_scaling], "float16 only" if self.grad_scaling else ""),
            ("channels_last", on_off[self.channels_last], r.get("channels_last", "")),
            ("compile", compile_text, compile_why),
            ("CPU bf16 weight gradients", on_off[self.cpu_bf16_weight_grad], r.get("cpu_bf16_weight_grad", "")),
            ("device augmentation", on_off[self.device_augment], r.get("device_augment", "")),
            ("loader workers", str(self.loader_workers), r.get("loader_workers", "")),
            ("CPU threads", str(self.threads), r.get("threads", "")),
            ("threads follow the load", on_off[self.adapt_threads], r.get("adapt_threads", "")),
            ("OpenMP wait policy", os.environ.get("OMP_WAIT_POLICY") or "OpenMP default", wait_policy_reason()),
        ]

    def table(self) -> str:
        """The plan as a text table (decision, choice, why), for the log."""
        return tabulate(self.rows(), headers=["decision", "choice", "why"], tablefmt="pipe")

    def apply_threads(self) -> None:
        """Cap this process's intra-op threads at the plan's (torch.set_num_threads); a lower count
        the process chose itself is kept."""
        if torch.get_num_threads() > self.threads:
            torch.set_num_threads(self.threads)

    def log(self) -> None:
        """Log the plan's table (INFO)."""
        logger.info("Run plan (%s):\n%s", self.purpose, self.table())


def wait_policy_reason() -> str:
    """Why OMP_WAIT_POLICY is what it is in this process (the command line's start choice, or the environment)."""
    choice = thread_policy.start_choice()
    if choice is not None:
        return choice.reason
    return "from the environment" + (" (the launching command's choice)" if thread_policy.BUSY_ENV in os.environ else "")


def check_plan_config(cfg) -> None:
    """Check the plan's enumerated keys without deciding anything (no device is resolved).

    Args:
        cfg: the config (MODEL.CHANNELS_LAST, MODEL.COMPILE, MODEL.COMPILE_BACKEND, MODEL.COMPILE_SCOPE, SOLVER.AMP.DTYPE,
            DATALOADER.NUM_WORKERS).
    Raises:
        UnknownChoiceError, ConfigError: the first wrong value (one line: key, choices, closest).
    """
    check_choice(cfg.MODEL.CHANNELS_LAST, CHANNELS_LAST_CHOICES, "MODEL.CHANNELS_LAST")
    normalize_compile_mode(cfg.MODEL.COMPILE)
    check_choice(cfg.MODEL.COMPILE_BACKEND, COMPILE_BACKENDS, "MODEL.COMPILE_BACKEND")
    compile_scope_decision(cfg.MODEL.COMPILE_SCOPE, "off")
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
    device = env.resolve_device(cfg.MODEL.DEVICE)
    reasons = {"device": _device_reason(cfg.MODEL.DEVICE)}
    amp = amp_decision(cfg.SOLVER.AMP.DTYPE, device.type) if cfg.SOLVER.AMP.ENABLED else None
    reasons["amp"] = "SOLVER.AMP.ENABLED off" if amp is None else (
        f"SOLVER.AMP.DTYPE {cfg.SOLVER.AMP.DTYPE}" if amp.autocast else "no native bfloat16 on this CPU")
    # oneDNN's bfloat16 weight gradient is slow on small maps (layers.cpu_bf16_conv): on a CPU that
    # computes bfloat16 natively, AMP training uses the matrix-product weight gradient there.
    cpu_bf16 = bool(device.type == "cpu" and cfg.SOLVER.AMP.ENABLED and env.cpu_native_bf16())
    reasons["cpu_bf16_weight_grad"] = ("native bfloat16 AMP on the CPU: matrix-product weight gradients on "
                                       "small maps" if cpu_bf16 else "only for bfloat16 AMP on a native-bf16 CPU")
    channels_last = use_channels_last(cfg.MODEL.CHANNELS_LAST, device, cpu_bf16=cpu_bf16)
    reasons["channels_last"] = f"MODEL.CHANNELS_LAST {cfg.MODEL.CHANNELS_LAST}"
    check_choice(cfg.MODEL.COMPILE_BACKEND, COMPILE_BACKENDS, "MODEL.COMPILE_BACKEND")
    mode, reasons["compile_mode"] = compile_decision(purpose, cfg.MODEL.COMPILE, device, architecture)
    scope, reasons["compile_scope"] = compile_scope_decision(cfg.MODEL.COMPILE_SCOPE, mode, freezes_layers(cfg))
    augment, reasons["device_augment"] = device_augment_decision(cfg, device.type)
    workers = loader_workers(cfg)
    reasons["loader_workers"] = "DATALOADER.NUM_WORKERS"
    usable = usable_cpus()
    threads, reasons["threads"] = cpu_threads(comm.get_local_size(), usable=usable)
    adapt, reasons["adapt_threads"] = adapts_threads(device.type, purpose, usable=usable)
    return RunPlan(purpose=purpose, device=device, amp=amp, channels_last=channels_last, compile_mode=mode,
                   compile_explicit=normalize_compile_mode(cfg.MODEL.COMPILE) != "auto",
                   compile_backend=str(cfg.MODEL.COMPILE_BACKEND), cpu_bf16_weight_grad=cpu_bf16,
                   device_augment=augment, loader_workers=workers, threads=threads, adapt_threads=adapt,
                   compile_scope=scope, reasons=reasons)


# Plans already decided in this process, by the config values they read: the same config
# is planned (and its table logged) once.
_PLANS: Dict[tuple, RunPlan] = {}
_LOGGED: set = set()
_MAX_PLANS = 16


def _plan_key(cfg, purpose: str, architecture) -> tuple:
    inp = cfg.INPUT
    # constant in a process, but tests stand in for them
    machine = (torch.cuda.is_available(), env.cpu_native_bf16(), comm.get_local_size(),
               os.environ.get("OMP_NUM_THREADS", ""), os.environ.get(thread_policy.BUSY_ENV, ""))
    return (purpose, architecture, machine, str(cfg.MODEL.DEVICE), bool(cfg.SOLVER.AMP.ENABLED), str(cfg.SOLVER.AMP.DTYPE),
            str(cfg.MODEL.CHANNELS_LAST), str(cfg.MODEL.COMPILE), str(cfg.MODEL.COMPILE_BACKEND),
            str(cfg.MODEL.COMPILE_SCOPE), freezes_layers(cfg),
            str(inp.DEVICE_AUGMENT), batched_op_names(cfg), reordered_keys(cfg), int(cfg.DATALOADER.NUM_WORKERS))


def build_run_plan(cfg, purpose: str = "train", log: bool = True) -> RunPlan:
    """The run plan of `cfg` in this process (decided once per config and purpose, then reused).

    Args:
        cfg: the config (MODEL.DEVICE, SOLVER.AMP.*, MODEL.CHANNELS_LAST, MODEL.COMPILE,
            MODEL.COMPILE_BACKEND, MODEL.COMPILE_SCOPE (with SOLVER.FREEZE_ITERS and MODEL.FREEZE_LAYERS),
            INPUT.DEVICE_AUGMENT and the INPUT ops it moves,
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
