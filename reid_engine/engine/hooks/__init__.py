"""The standard training hooks: timing, writers, checkpoints, LR scheduling, evaluation,
precise BN, layer freezing, EMA teachers, profiling and memory statistics, the CPU thread budget
(one module per concern)."""
from ..train_loop import HookBase
from .basic import TIMER_WARMUP_ITERS, CallbackHook, IterationTimer, LRScheduler, PeriodicWriter
from .checkpointing import BestCheckpointer, PeriodicCheckpointer, Preemption
from .evaluation import EvalHook, flatten_results_dict, periodic_evaluation_due
from .model_state import CompileGuard, EMATeacher, LayerFreeze, PreciseBN
from .profiling import TorchMemoryStats, TorchProfiler
from .threads import ThreadBudgetHook

__all__ = [
    "HookBase",
    "TIMER_WARMUP_ITERS",
    "CallbackHook",
    "IterationTimer",
    "PeriodicWriter",
    "PeriodicCheckpointer",
    "BestCheckpointer",
    "Preemption",
    "CompileGuard",
    "LRScheduler",
    "EvalHook",
    "PreciseBN",
    "LayerFreeze",
    "EMATeacher",
    "TorchProfiler",
    "TorchMemoryStats",
    "ThreadBudgetHook",
    "flatten_results_dict",
    "periodic_evaluation_due",
]
