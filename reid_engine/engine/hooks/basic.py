"""Hooks that keep the loop going: callbacks, iteration timing, periodic writers and LR scheduling."""
import datetime
import itertools
import logging
import time
from collections import Counter
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from ...utils.events import EventWriter
from ...utils.file_io import FileWriteError
from ...utils.logger import check_log_writes
from ..train_loop import HookBase

logger = logging.getLogger(__name__)

#: first steps of each train() call left out of the step timing (start-up costs)
TIMER_WARMUP_ITERS = 3


def _hms(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


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


def _training_device(trainer) -> Optional[torch.device]:
    """The device of the trainer's model (its first parameter or buffer), None without one."""
    model = getattr(trainer, "model", None)
    if not isinstance(model, torch.nn.Module):
        return None
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return None


def synchronize_device(device: Optional[torch.device]) -> bool:
    """Wait for the work queued on an asynchronous device (a GPU).

    Args:
        device: the training device; None or a CPU device waits for nothing.

    Returns:
        True when the device runs asynchronously (it was synchronised), False on the CPU.
    """
    if device is None or device.type == "cpu":
        return False
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    else:
        getattr(torch, device.type).synchronize()
    return True


class IterationTimer(HookBase):
    """Time each step (written as ``time`` after ``warmup_iter`` steps) and log the
    training speed and the time spent in hooks at the end. Register it first, so its
    step timer covers the step itself and its after_step runs before the other hooks'.

    Honest on an asynchronous device (a GPU) without slowing the steady-state step: the
    device is synchronised only every ``sync_period`` steps (the writers' period), at the
    first timed step and at the last one; each step since the previous synchronisation is
    then written with the mean step time of that span, which includes the device work the
    host had only queued. On the CPU nothing waits and each step gets its own time.

    Warm-up steps (the first ``warmup_iter`` ones, and any step whose ``run_step`` set
    ``trainer.warmup_step``: compilation, graph capture) are left out of ``time``, of the
    ETA that the writers derive from it and of the overall speed, which names them.
    """

    def __init__(self, warmup_iter: int = TIMER_WARMUP_ITERS, sync_period: int = 20):
        """
        Args:
            warmup_iter: number of first steps left out of the timing.
            sync_period: steps between device synchronisations; use the writers' period.
        """
        self._warmup_iter = warmup_iter
        self._sync_period = max(1, int(sync_period))
        self._device: Optional[torch.device] = None
        self._pending: List[Tuple[int, float]] = []  # (iteration, host seconds) since the last sync
        self._step_start = self._train_start = self._timed_start = 0.0
        self._timed_iters = self._warmup_iters = 0
        self._in_steps = self._warmup_seconds = self._late_warmup_seconds = 0.0
        self.total_time: float = 0.0
        self.hook_time: float = 0.0

    def before_train(self):
        self._device = _training_device(self.trainer)
        self._pending = []
        self._timed_iters = self._warmup_iters = 0
        self._in_steps = self._warmup_seconds = self._late_warmup_seconds = 0.0
        self._train_start = self._timed_start = time.perf_counter()

    def before_step(self):
        self._step_start = time.perf_counter()

    def after_step(self):
        it = self.trainer.iter
        done = it - self.trainer.start_iter + 1
        first_steps = done <= self._warmup_iter
        warmup = first_steps or bool(getattr(self.trainer, "warmup_step", False))
        # Warm-up steps sync too, so that their queued work does not land in a timed step.
        boundary = (warmup or done == self._warmup_iter + 1 or (it + 1) % self._sync_period == 0
                    or it == self.trainer.max_iter - 1)
        synced = synchronize_device(self._device) if boundary else False
        now = time.perf_counter()
        seconds = now - self._step_start
        if warmup:
            self._warmup_iters += 1
            self._warmup_seconds += seconds
            if first_steps:
                self._timed_start = now  # the totals start after the first warm-up steps
            else:
                self._late_warmup_seconds += seconds
            self._write_pending(synced)
            return
        self._pending.append((it, seconds))
        self._in_steps += seconds
        self._timed_iters += 1
        if boundary:
            self._write_pending(synced)

    def _write_pending(self, synced: bool) -> None:
        """Write ``time`` for the steps since the last synchronisation: their mean after a
        synchronisation of an asynchronous device, else each step's own time."""
        pending, self._pending = self._pending, []
        if synced and pending:
            mean = sum(s for _, s in pending) / len(pending)
            pending = [(it, mean) for it, _ in pending]
        for it, seconds in pending:
            self.trainer.storage.put_scalar("time", seconds, iteration=it)

    def after_train(self):
        self._write_pending(False)  # a step raised: what was timed before it, unsynchronised
        now = time.perf_counter()
        total = now - self._timed_start - self._late_warmup_seconds
        # Kept for benchmarks and callers: seconds since warm-up, and the part spent in hooks.
        self.total_time, self.hook_time = total, total - self._in_steps
        if self._timed_iters > 0 and self._in_steps > 0:
            logger.info(
                f"Overall training speed: {self._timed_iters} iterations in {_hms(self._in_steps)} "
                f"({self._in_steps / self._timed_iters:.4f} s / it), excluding {self._warmup_iters} warm-up "
                f"iterations (start-up, compilation: {self._warmup_seconds:.1f} s)"
            )
        all_hooks = now - self._train_start - self._in_steps - self._warmup_seconds
        logger.info(f"Total training time: {_hms(now - self._train_start)} ({_hms(all_hooks)} on hooks)")


class PeriodicWriter(HookBase):
    """Call every writer when ``(iter + 1) % period == 0`` and at the last iteration;
    after training, write once more (e.g. final evaluation results) and close them.
    Optionally write once more at one early iteration, so a slow run shows its first
    progress line (with an ETA) after a few steps instead of after ``period`` steps.

    A writer that cannot write (disk full, file size limit), or a log line that could not
    be written (checked after every step), stops the run with one
    :class:`~reid_engine.utils.file_io.FileWriteError` line. Registered before the
    periodic checkpointer, it stops before that step's checkpoint would be saved into the
    full disk: the last checkpoint stays the one to resume from, and the resumed run
    writes again what was lost.
    """

    def __init__(self, writers: Sequence[EventWriter], period: int = 20, early_iter: Optional[int] = None):
        """
        Args:
            writers: EventWriter instances.
            period: iterations between writes.
            early_iter: also write at this iteration (None: never), e.g. the first one the
                IterationTimer times. An absolute iteration, so metrics.json gets the same
                records whether or not a run was interrupted and resumed.
        """
        for w in writers:
            if not isinstance(w, EventWriter):
                raise TypeError(f"PeriodicWriter expects EventWriter instances, got {type(w).__name__}")
        self._writers = list(writers)
        self._period = period
        self._early_iter = early_iter
        self._failed = False  # a write failed: the run is stopping on that error

    def after_step(self):
        it = self.trainer.iter
        try:
            if (it + 1) % self._period == 0 or it == self.trainer.max_iter - 1 or it == self._early_iter:
                for writer in self._writers:
                    writer.write()
            check_log_writes()
        except FileWriteError:
            self._failed = True
            raise

    def after_train(self):
        """Write once more and close every writer. After a write failure nothing more is
        written (the run is stopping on it); a failure now ends a completed run with its
        one line, and is logged when the run is stopping for another reason (not to hide it)."""
        errors: List[FileWriteError] = []
        for writer in self._writers:
            try:
                if not self._failed:
                    writer.write()
            except FileWriteError as e:
                errors.append(e)
            finally:
                writer.close()
        if self._failed:
            return
        try:
            check_log_writes()
        except FileWriteError as e:
            errors.append(e)
        if not errors:
            return
        self._failed = True
        if self.trainer.iter >= self.trainer.max_iter:  # completed: nothing else is being raised
            raise errors[0]
        for e in errors:
            logger.error(str(e))


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
