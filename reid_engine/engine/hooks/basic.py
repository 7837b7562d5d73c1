"""Hooks that keep the loop going: callbacks, iteration timing, periodic writers and LR scheduling."""
import datetime
import logging
from collections import Counter
from typing import Callable, Optional, Sequence

import torch
from fvcore.common.timer import Timer

from ...utils.events import EventWriter
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


class IterationTimer(HookBase):
    """Time each step (written as ``time`` after ``warmup_iter`` steps) and log the
    training speed and the time spent in hooks at the end. Register it first, so its
    step timer covers the step itself and its after_step runs before the other hooks'.
    """

    def __init__(self, warmup_iter: int = TIMER_WARMUP_ITERS):
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
    after training, write once more (e.g. final evaluation results) and close them.
    Optionally write once more at one early iteration, so a slow run shows its first
    progress line (with an ETA) after a few steps instead of after ``period`` steps."""

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

    def after_step(self):
        it = self.trainer.iter
        if (it + 1) % self._period == 0 or it == self.trainer.max_iter - 1 or it == self._early_iter:
            for writer in self._writers:
                writer.write()

    def after_train(self):
        for writer in self._writers:
            writer.write()
            writer.close()


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
