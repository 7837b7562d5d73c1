"""The standard training hooks: timing, writers, checkpoints, LR scheduling,
evaluation, precise BN, layer freezing, profiling and memory statistics."""

import datetime
import itertools
import logging
import math
import os
import shutil
import time
from collections import Counter
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence

import torch
from fvcore.common.timer import Timer
from fvcore.nn.precise_bn import get_bn_modules, update_bn_stats
from torch import nn

from ..utils import comm
from ..utils.checkpoint import PeriodicCheckpointer as _PeriodicCheckpointerBase
from ..utils.events import EventStorage, EventWriter
from .train_loop import HookBase

__all__ = [
    "HookBase",
    "CallbackHook",
    "IterationTimer",
    "PeriodicWriter",
    "PeriodicCheckpointer",
    "BestCheckpointer",
    "LRScheduler",
    "EvalHook",
    "PreciseBN",
    "LayerFreeze",
    "TorchProfiler",
    "TorchMemoryStats",
    "flatten_results_dict",
]

logger = logging.getLogger(__name__)


def _hms(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DataParallel/DDP wrapper (or the model itself)."""
    return model.module if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else model


class CallbackHook(HookBase):
    """Run user functions ``f(trainer)`` at before_train / after_train / before_step /
    after_step. The functions are dropped after training (they may be closures holding
    the trainer)."""

    def __init__(self, *, before_train: Optional[Callable] = None, after_train: Optional[Callable] = None,
                 before_step: Optional[Callable] = None, after_step: Optional[Callable] = None):
        """Each argument: None or a callable taking the trainer."""
        self._before_train = before_train
        self._after_train = after_train
        self._before_step = before_step
        self._after_step = after_step

    def before_train(self):
        if self._before_train:
            self._before_train(self.trainer)

    def after_train(self):
        try:
            if self._after_train:
                self._after_train(self.trainer)
        finally:
            self._before_train = self._after_train = self._before_step = self._after_step = None

    def before_step(self):
        if self._before_step:
            self._before_step(self.trainer)

    def after_step(self):
        if self._after_step:
            self._after_step(self.trainer)


class IterationTimer(HookBase):
    """Time each step (written as ``time`` after ``warmup_iter`` steps) and log the
    training speed and the time spent in hooks at the end. Register it first, so its
    step timer covers the step itself and its after_step runs before the other hooks'.
    """

    def __init__(self, warmup_iter: int = 3):
        """
        Args:
            warmup_iter: number of first steps left out of the timing.
        """
        self._warmup_iter = warmup_iter
        self._step_timer = Timer()
        self._train_timer = Timer()  # wall time since warm-up ended
        self._steps_timer = Timer()  # time inside steps since warm-up ended (paused in hooks)
        self._timed_iters = 0
        self.total_time: float = 0.0
        self.hook_time: float = 0.0

    def before_train(self):
        self._timed_iters = 0
        self._train_timer.reset()
        self._steps_timer.reset()
        self._steps_timer.pause()

    def before_step(self):
        self._step_timer.reset()
        self._steps_timer.resume()

    def after_step(self):
        self._steps_timer.pause()
        done = self.trainer.iter - self.trainer.start_iter + 1
        if done > self._warmup_iter:
            self.trainer.storage.put_scalar("time", self._step_timer.seconds())
            self._timed_iters += 1
        else:
            # Warm-up (first CUDA calls, worker start-up) is excluded from both totals.
            self._train_timer.reset()
            self._steps_timer.reset()
            self._steps_timer.pause()

    def after_train(self):
        if not self._steps_timer.is_paused():  # a step raised before after_step
            self._steps_timer.pause()
        total = self._train_timer.seconds()
        in_steps = self._steps_timer.seconds()
        # Kept for benchmarks and callers: seconds since warm-up, and the part spent in hooks.
        self.total_time, self.hook_time = total, total - in_steps
        if self._timed_iters > 0 and in_steps > 0:
            logger.info(
                f"Overall training speed: {self._timed_iters} iterations in {_hms(in_steps)} "
                f"({in_steps / self._timed_iters:.4f} s / it)"
            )
        logger.info(f"Total training time: {_hms(total)} ({_hms(total - in_steps)} on hooks)")


class PeriodicWriter(HookBase):
    """Call every writer when ``(iter + 1) % period == 0`` and at the last iteration;
    after training, write once more (e.g. final evaluation results) and close them."""

    def __init__(self, writers: Sequence[EventWriter], period: int = 20):
        """
        Args:
            writers: EventWriter instances.
            period: iterations between writes.
        """
        for w in writers:
            if not isinstance(w, EventWriter):
                raise TypeError(f"PeriodicWriter expects EventWriter instances, got {type(w).__name__}")
        self._writers = list(writers)
        self._period = period

    def after_step(self):
        if (self.trainer.iter + 1) % self._period == 0 or self.trainer.iter == self.trainer.max_iter - 1:
            for writer in self._writers:
                writer.write()

    def after_train(self):
        for writer in self._writers:
            writer.write()
            writer.close()


class PeriodicCheckpointer(_PeriodicCheckpointerBase, HookBase):
    """Save ``model_{iter:07d}.pth`` when ``(iter + 1) % period == 0`` and
    ``model_final.pth`` at the last iteration (see utils.checkpoint.PeriodicCheckpointer
    for keep-last-N). ``max_iter`` comes from the trainer."""

    def before_train(self):
        self.max_iter = self.trainer.max_iter

    def after_step(self):
        self.step(self.trainer.iter)


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class BestCheckpointer(HookBase):
    """After each evaluation, save ``{file_prefix}.pth`` when the watched metric beats
    the best so far (NaN/inf never count). Register it after the EvalHook; the best
    value and its iteration are part of the trainer state, so they survive a resume.
    ``last_checkpoint`` keeps naming the newest periodic/final checkpoint when one exists."""

    def __init__(self, eval_period: int, checkpointer, val_metric: str, mode: str = "max",
                 file_prefix: str = "model_best"):
        """
        Args:
            eval_period: the EvalHook's period (0: only after training).
            checkpointer: a Checkpointer (``save(name, **extra)``, ``has_checkpoint()``,
                ``get_checkpoint_file()``, ``tag_last_checkpoint(basename)``).
            val_metric: the storage scalar name, e.g. ``"Market1501/metric"``.
            mode: "max" or "min": which direction is better.
            file_prefix: name of the checkpoint file (without ``.pth``).
        """
        if mode not in ("max", "min"):
            raise ValueError(f"BestCheckpointer mode must be 'max' or 'min', got {mode!r}")
        self._period = eval_period
        self._checkpointer = checkpointer
        self._val_metric = val_metric
        self._mode = mode
        self._file_prefix = file_prefix
        self.best_metric: Optional[float] = None
        self.best_iter: Optional[int] = None

    def _improves(self, value: float) -> bool:
        if not _is_finite_number(value):
            return False
        if self.best_metric is None:
            return True
        return value > self.best_metric if self._mode == "max" else value < self.best_metric

    def _best_checking(self) -> None:
        storage = self.trainer.storage
        entry = storage.latest().get(self._val_metric)
        if entry is None or entry[1] != storage.iter:
            logger.warning(f"BestCheckpointer: metric '{self._val_metric}' was not written at iteration "
                           f"{storage.iter}; is the EvalHook registered before it and the name right?")
            return
        value, itr = entry
        if self._improves(value):
            previous = self.best_metric
            self.best_metric, self.best_iter = float(value), int(itr)
            self._save_best(int(itr))
            logger.info(f"Saved {self._file_prefix}.pth at iteration {itr}: {self._val_metric} = {value:.5g} "
                        f"(previous best: {'none' if previous is None else f'{previous:.5g}'})")
        else:
            reason = "not a finite number" if not _is_finite_number(value) else "no improvement"
            logger.info(f"Not saving {self._file_prefix}.pth: {self._val_metric} = {value} at iteration {itr} "
                        f"({reason}; best {self.best_metric} at iteration {self.best_iter})")

    def _save_best(self, iteration: int) -> None:
        # model_best is a side file: last_checkpoint keeps naming the periodic/final
        # checkpoint a resume should use (when there is one).
        previous = self._checkpointer.get_checkpoint_file() if self._checkpointer.has_checkpoint() else ""
        self._checkpointer.save(self._file_prefix, iteration=iteration)
        if previous and os.path.basename(previous) != f"{self._file_prefix}.pth":
            self._checkpointer.tag_last_checkpoint(os.path.basename(previous))

    def after_step(self):
        next_iter = self.trainer.iter + 1
        if self._period > 0 and next_iter % self._period == 0 and next_iter != self.trainer.max_iter:
            self._best_checking()

    def after_train(self):
        if self.trainer.iter + 1 >= self.trainer.max_iter:
            self._best_checking()

    def state_dict(self) -> dict:
        """The best value and its iteration (empty until a first value is recorded)."""
        if self.best_metric is None:
            return {}
        return {"best_metric": self.best_metric, "best_iter": self.best_iter}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the best value and its iteration."""
        self.best_metric = float(state_dict["best_metric"])
        self.best_iter = int(state_dict["best_iter"])


class LRScheduler(HookBase):
    """Record ``lr`` (of the parameter group with the most parameters) and step the
    scheduler after every iteration. The scheduler's state is checkpointed."""

    def __init__(self, optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None):
        """
        Args:
            optimizer: defaults to ``trainer.optimizer``.
            scheduler: a torch LR scheduler (``step()``, ``state_dict()``); defaults to
                ``trainer.scheduler``.
        """
        self._optimizer = optimizer
        self._scheduler = scheduler
        self._group_index: Optional[int] = None

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer whose lr is recorded."""
        return self._optimizer if self._optimizer is not None else self.trainer.optimizer

    @property
    def scheduler(self):
        """The scheduler stepped every iteration."""
        return self._scheduler if self._scheduler is not None else self.trainer.scheduler

    @staticmethod
    def get_best_param_group_id(optimizer: torch.optim.Optimizer) -> int:
        """Index of the group with the most parameters; when every group has one
        parameter, the first group with the most common lr."""
        groups = optimizer.param_groups
        largest = max(len(g["params"]) for g in groups)
        if largest == 1:
            common_lr = Counter(g["lr"] for g in groups).most_common(1)[0][0]
            return next(i for i, g in enumerate(groups) if g["lr"] == common_lr)
        return next(i for i, g in enumerate(groups) if len(g["params"]) == largest)

    def before_train(self):
        self._group_index = self.get_best_param_group_id(self.optimizer)

    def after_step(self):
        lr = self.optimizer.param_groups[self._group_index]["lr"]
        self.trainer.storage.put_scalar("lr", lr, smoothing_hint=False)
        self.scheduler.step()

    def state_dict(self) -> dict:
        """The scheduler's state_dict."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the scheduler's state."""
        logger.info("Loading the LR scheduler state from the checkpoint")
        self.scheduler.load_state_dict(state_dict)


def flatten_results_dict(results: Mapping, prefix: str = "") -> Dict[str, object]:
    """Flatten ``{"a": {"b": 1.0}}`` into ``{"a/b": 1.0}``."""
    flat = {}
    for key, value in results.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_results_dict(value, name + "/"))
        else:
            flat[name] = value
    return flat


class EvalHook(HookBase):
    """Run ``eval_function()`` when ``(iter + 1) % eval_period == 0`` (except at the
    last iteration) and once after training, if training completed. Results (a nested
    dict of floats) are flattened with ``/`` into the storage."""

    def __init__(self, eval_period: int, eval_function: Callable[[], Optional[Mapping]]):
        """
        Args:
            eval_period: iterations between evaluations; 0 evaluates only at the end.
            eval_function: takes no argument, returns a nested dict of floats (or
                None/empty on workers with nothing to report).
        """
        self._period = eval_period
        self._func = eval_function

    def _do_eval(self) -> None:
        results = self._func()
        if results:
            if not isinstance(results, Mapping):
                raise TypeError(f"EvalHook: eval_function must return a (nested) dict of floats, got "
                                f"{type(results).__name__}")
            flat = {}
            for name, value in flatten_results_dict(results).items():
                try:
                    flat[name] = float(value)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"EvalHook: eval_function must return a nested dict of floats; "
                                     f"got '{name}: {value!r}'") from e
            self.trainer.storage.put_scalars(**flat, smoothing_hint=False)
        # Evaluation may take different time on each worker: wait for all of them.
        comm.synchronize()

    def after_step(self):
        next_iter = self.trainer.iter + 1
        if self._period > 0 and next_iter % self._period == 0 and next_iter != self.trainer.max_iter:
            self._do_eval()

    def after_train(self):
        # trainer.iter reaches max_iter only when the last step completed.
        if self.trainer.iter + 1 >= self.trainer.max_iter:
            self._do_eval()
        # The function is often a closure holding the trainer: release it.
        self._func = None


class PreciseBN(HookBase):
    """Recompute BatchNorm running statistics over ``num_iter`` batches with the
    weights fixed, at each period and after the last iteration. Disabled when the
    model has no BatchNorm layer in training mode."""

    def __init__(self, period: int, model: nn.Module, data_loader: Iterable, num_iter: int):
        """
        Args:
            period: iterations between updates (0: only at the end).
            model: the model (training mode); called on each batch.
            data_loader: an iterable of batches (a training loader).
            num_iter: number of batches per update.
        """
        self._period = period
        self._model = model
        self._data_loader = data_loader
        self._num_iter = num_iter
        self._data_iter = None
        self._disabled = len(get_bn_modules(model)) == 0
        if self._disabled:
            logger.info("PreciseBN is disabled: the model has no BatchNorm layer in training mode")

    def after_step(self):
        next_iter = self.trainer.iter + 1
        if next_iter == self.trainer.max_iter or (self._period > 0 and next_iter % self._period == 0):
            self.update_stats()

    def _batches(self):
        if self._data_iter is None:
            self._data_iter = iter(self._data_loader)
        for count in itertools.count(1):
            if count % 100 == 0:
                logger.info(f"Running precise-BN: {count}/{self._num_iter} batches")
            try:
                yield next(self._data_iter)
            except StopIteration:  # a finite loader: start another pass
                self._data_iter = iter(self._data_loader)
                yield next(self._data_iter)

    def update_stats(self) -> None:
        """Recompute the BN statistics now (no-op when disabled)."""
        if self._disabled:
            return
        if not get_bn_modules(self._model):
            logger.info("PreciseBN skipped: no BatchNorm layer is in training mode now")
            return
        logger.info(f"Running precise-BN for {self._num_iter} batches (statistics vary between runs)")
        # The model may write metrics in training mode: keep them out of the trainer's storage.
        with EventStorage():
            update_bn_stats(self._model, self._batches(), self._num_iter)


def _matches_prefix(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


class LayerFreeze(HookBase):
    """Keep the modules named by ``freeze_layers`` (module-name prefixes, e.g.
    ``"backbone"`` or ``"heads.bottleneck"``) frozen for the first ``freeze_iters``
    iterations: in eval mode (re-applied before every step, since evaluation may set
    train mode) and without updates (their gradients are cleared after backward, so any
    torch optimizer skips them). They are released at iteration ``freeze_iters``.
    """

    def __init__(self, model: nn.Module, freeze_layers: Sequence[str], freeze_iters: int):
        """
        Args:
            model: the model (DDP-wrapped or not).
            freeze_layers: module-name prefixes.
            freeze_iters: number of frozen iterations.
        """
        self.model = model
        self.freeze_layers = [p.strip(".") for p in freeze_layers]
        self.freeze_iters = int(freeze_iters)
        inner = _unwrap(model)
        self._modules = [m for n, m in inner.named_modules() if n and _matches_prefix(n, self.freeze_layers)]
        self._params = [p for n, p in inner.named_parameters() if _matches_prefix(n, self.freeze_layers)]
        unknown = [p for p in self.freeze_layers
                   if not any(n == p or n.startswith(p + ".") for n, _ in inner.named_modules())]
        if unknown:
            top = ", ".join(n for n, _ in inner.named_children())
            raise ValueError(f"MODEL.FREEZE_LAYERS names {unknown} which match no module of the model; "
                             f"use module-name prefixes such as: {top}")
        self.is_frozen = False

    def _freeze(self) -> None:
        for module in self._modules:
            module.eval()
        if not self.is_frozen:
            self.is_frozen = True
            logger.info(f"Freezing {self.freeze_layers} until iteration {self.freeze_iters}")

    def _release(self) -> None:
        for module in self._modules:
            module.train(self.model.training)
        self.is_frozen = False
        logger.info(f"Releasing the frozen layers {self.freeze_layers} at iteration {self.trainer.iter}")

    def before_step(self):
        if self.trainer.iter < self.freeze_iters:
            self._freeze()
        elif self.is_frozen:
            self._release()

    def after_backward(self):
        if self.is_frozen:
            for param in self._params:
                param.grad = None

    def after_train(self):
        if self.is_frozen:  # training ended while frozen: leave the model as it was built
            self._release()


class TorchProfiler(HookBase):
    """Profile the steps ``enable_predicate(trainer)`` selects with torch.profiler and
    write ``profiler-trace-iter{N}.json`` chrome traces (and tensorboard traces under
    ``log/profiler-tensorboard-iter{N}``) into ``output_dir``."""

    def __init__(self, enable_predicate: Callable, output_dir: str, *, activities=None,
                 save_tensorboard: bool = True):
        """
        Args:
            enable_predicate: ``f(trainer) -> bool``, checked before each step.
            output_dir: where traces are written.
            activities: torch.profiler activities (default: CPU, plus CUDA when available).
            save_tensorboard: also write a tensorboard trace.
        """
        self._enable_predicate = enable_predicate
        self._output_dir = output_dir
        if activities is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._activities = activities
        self._save_tensorboard = save_tensorboard
        self._profiler = None

    def before_step(self):
        if not self._enable_predicate(self.trainer):
            self._profiler = None
            return
        self._profiler = torch.profiler.profile(activities=self._activities, record_shapes=True,
                                                profile_memory=True, with_stack=True)
        self._profiler.__enter__()

    def after_step(self):
        if self._profiler is None:
            return
        self._profiler.__exit__(None, None, None)
        os.makedirs(self._output_dir, exist_ok=True)
        path = os.path.join(self._output_dir, f"profiler-trace-iter{self.trainer.iter}.json")
        self._profiler.export_chrome_trace(path)
        if self._save_tensorboard:
            # A trace can be exported once: copy it where the tensorboard plugin looks,
            # named <worker>.<id>.pt.trace.json as torch.profiler.tensorboard_trace_handler does.
            tb_dir = os.path.join(self._output_dir, "log", f"profiler-tensorboard-iter{self.trainer.iter}")
            os.makedirs(tb_dir, exist_ok=True)
            tb_name = f"worker{comm.get_rank()}.{time.time_ns()}.pt.trace.json"
            shutil.copyfile(path, os.path.join(tb_dir, tb_name))
        logger.info(f"Wrote the profiler trace of iteration {self.trainer.iter} to {path}")
        self._profiler = None

    def after_train(self):
        if self._profiler is not None:  # a profiled step raised
            self._profiler.__exit__(None, None, None)
            self._profiler = None


class TorchMemoryStats(HookBase):
    """Log CUDA memory statistics every ``period`` iterations, at most ``max_runs``
    times (the last time with the full ``torch.cuda.memory_summary()``). No-op without
    CUDA."""

    def __init__(self, period: int = 20, max_runs: int = 10):
        """
        Args:
            period: iterations between reports.
            max_runs: maximum number of reports.
        """
        self._period = period
        self._max_runs = max_runs
        self._runs = 0

    def after_step(self):
        if self._runs >= self._max_runs or not torch.cuda.is_available():
            return
        if (self.trainer.iter + 1) % self._period == 0 or self.trainer.iter == self.trainer.max_iter - 1:
            mb = 1024.0 * 1024.0
            logger.info(
                f"iter: {self.trainer.iter}  max_reserved_mem: {torch.cuda.max_memory_reserved() / mb:.0f}MB  "
                f"reserved_mem: {torch.cuda.memory_reserved() / mb:.0f}MB  "
                f"max_allocated_mem: {torch.cuda.max_memory_allocated() / mb:.0f}MB  "
                f"allocated_mem: {torch.cuda.memory_allocated() / mb:.0f}MB"
            )
            self._runs += 1
            if self._runs == self._max_runs:
                logger.info("\n" + torch.cuda.memory_summary())
            torch.cuda.reset_peak_memory_stats()
