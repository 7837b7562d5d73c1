"""The generic training loop: hooks (:class:`HookBase`) and the trainer that calls them (:class:`TrainerBase`).

The order of hook calls and what the trainer's state dict holds (for exact resume) are the
contract every trainer and hook builds on; the step itself is ``engine.train_loop``'s.
"""
import contextlib
import functools
import logging
import weakref
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Protocol

import torch

from ..reliability import preemption
from ..reliability.preemption import TrainingPreempted
from ..reliability.step_guards import default_step_wrappers
from ..utils.errors import ReidUserError
from ..utils.events import EventStorage

__all__ = ["HookBase", "StepWrapper", "TrainerBase", "TrainingStopped"]

# The name these lines have had in log.txt since the loop lived in train_loop.py.
logger = logging.getLogger("reid_engine.engine.train_loop")


class TrainingStopped(ReidUserError):
    """Training ended early on purpose, not by a failure: a hook raises a subclass of it
    (e.g. a hyperparameter search that prunes the run), with the reason as its message.

    The trainer logs it as one INFO line, "Training stopped at iteration N: <reason>",
    without a traceback, runs ``after_train`` and re-raises it to its caller.
    """

    def __init__(self, reason: str, iteration: int = -1):
        super().__init__(reason)
        self.iteration = iteration

    def __reduce__(self):  # keep the fields when the exception crosses a process boundary
        return type(self), (str(self), self.iteration)


class HookBase:
    """Base class of the hooks a :class:`TrainerBase` calls around each iteration.

    ``self.trainer`` is set by :meth:`TrainerBase.register_hooks` to a weak proxy of
    the trainer. Order of calls::

        before_train()
        for iter in range(start_iter, max_iter):
            before_step(); trainer.run_step() (calls after_backward()); after_step()
        after_train()   # also when a step raised

    ``before_step`` must be cheap; slow work belongs in ``after_step``.
    """

    trainer: "TrainerBase" = None

    def before_train(self) -> None:
        """Called once before the first iteration."""

    def after_train(self) -> None:
        """Called once after the last iteration, or after a failed one."""

    def before_step(self) -> None:
        """Called before each iteration."""

    def after_backward(self) -> None:
        """Called after the backward pass of each iteration, before the optimizer step."""

    def after_step(self) -> None:
        """Called after each iteration."""

    def state_dict(self) -> dict:
        """Return the hook's state for checkpoints; ``{}`` means stateless."""
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a state returned by :meth:`state_dict`."""


class StepWrapper(Protocol):
    """Machinery composed around the loop from outside it, called at three fixed points of
    :meth:`TrainerBase.train`: ``watch(trainer)`` before the hooks' ``before_train`` (what it returns
    is called after their ``after_train``); ``run_step(trainer, step)`` runs ``step`` (``run_step``)
    each iteration, the first of ``trainer.step_wrappers`` outermost; ``failure(trainer, exc)``: the
    user error an exception that ends training stands for, or None. The defaults are
    ``reliability.step_guards``' (dead and stopped loader workers; interruptible long steps).
    """

    def watch(self, trainer: "TrainerBase") -> Callable[[], None]: ...

    def run_step(self, trainer: "TrainerBase", step: Callable[[], None]) -> None: ...

    def failure(self, trainer: "TrainerBase", exc: Exception) -> Optional[ReidUserError]: ...


class TrainerBase:
    """A trainer with hooks: runs ``run_step`` from ``start_iter`` to ``max_iter``.

    Attributes:
        iter: the current iteration (``max_iter`` once training completed).
        start_iter, max_iter: the range of the current/last ``train`` call.
        storage: the :class:`EventStorage` opened during training.
        warmup_step: False at the start of each step; a ``run_step`` that pays a one-off
            cost (compilation, graph capture) sets it, and the IterationTimer then leaves
            the step out of ``time``, the ETA and the overall speed.
    """

    def __init__(self) -> None:
        self._hooks: List[HookBase] = []
        self.iter: int = 0
        self.start_iter: int = 0
        self.max_iter: int = 0
        self.storage: Optional[EventStorage] = None
        self._pending_storage_state: Optional[dict] = None
        self._training = False  # inside train(): self.storage is the open storage
        self.warmup_step = False
        #: machinery composed around the loop (:class:`StepWrapper`): loader faults, interruptible steps
        self.step_wrappers: List[StepWrapper] = default_step_wrappers()

    def register_hooks(self, hooks: Iterable[Optional[HookBase]]) -> None:
        """Append hooks (called in this order); None entries are dropped.

        Each hook gets ``hook.trainer``, a weak proxy of this trainer, so hooks never
        keep it alive (no reference cycle).
        """
        hooks = [h for h in hooks if h is not None]
        for h in hooks:
            if not isinstance(h, HookBase):
                raise TypeError(f"register_hooks expects HookBase instances, got {type(h).__name__}")
            h.trainer = weakref.proxy(self)
        self._hooks.extend(hooks)

    def train(self, start_iter: int, max_iter: int, hooks_only: bool = False) -> None:
        """Run iterations ``start_iter`` .. ``max_iter - 1`` with the hooks, each step through the
        step wrappers (:class:`StepWrapper`).

        Args:
            start_iter, max_iter: the iterations.
            hooks_only: with ``start_iter == max_iter``, run no step but the hooks' ``before_train``
                and ``after_train`` of a completed run (a final evaluation a stop signal cut short).
        Raises:
            ValueError: when ``start_iter >= max_iter`` (but for ``hooks_only`` and equal ones).
            ReidUserError: raised inside (a hook, a loader) or what a wrapper made of a failure (a
                dead loader worker, a stop signal), logged as one line without its traceback (any
                other exception is logged with it); TrainingStopped is a hook's intended early stop.
        """
        start_iter, max_iter = int(start_iter), int(max_iter)
        if start_iter >= max_iter and not (hooks_only and start_iter == max_iter):
            raise ValueError(
                f"nothing to train: start_iter {start_iter} >= max_iter {max_iter} (the run is "
                "already complete; increase the schedule length or start without --resume)"
            )
        logger.info(f"Starting training from iteration {start_iter}")
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        step = self._wrapped_step()
        with EventStorage(start_iter) as self.storage, contextlib.ExitStack() as unwatch:
            self._open_storage()
            unwatch.callback(setattr, self, "_training", False)  # last: after the wrappers' ends
            for wrapper in self.step_wrappers:
                unwatch.callback(wrapper.watch(self))
            try:
                self.before_train()
                for self.iter in range(start_iter, max_iter):
                    self.before_step()
                    step()
                    self.after_step()
                self.flush_metrics()  # a bad loss staged in the last steps fails the run here
                self.iter = max_iter  # one past the last step: hooks tell a completed run from a failed one
            except Exception as e:
                failure = e if isinstance(e, ReidUserError) else self._user_error(e)
                if failure is None:  # a bug, not a user error: keep its traceback
                    logger.exception(f"Exception during training at iteration {self.iter}:")
                    raise
                self._log_stop(failure)
                if failure is e:
                    raise
                raise failure from e
            finally:
                self.after_train()

    def _open_storage(self) -> None:
        """Apply the event histories a checkpoint loaded before training."""
        if self._pending_storage_state is not None:
            self.storage.load_state_dict(self._pending_storage_state)
            self._pending_storage_state = None
        self._training = True

    def _wrapped_step(self) -> Callable[[], None]:
        """``run_step`` inside every step wrapper, the first outermost."""
        step = self.run_step
        for wrapper in reversed(self.step_wrappers):
            step = functools.partial(wrapper.run_step, self, step)
        return step

    def _user_error(self, exc: Exception) -> Optional[ReidUserError]:
        """The user error a step wrapper makes of `exc` (None: a bug)."""
        for wrapper in self.step_wrappers:
            failure = wrapper.failure(self, exc)
            if failure is not None:
                return failure
        return None

    def _log_stop(self, error: ReidUserError) -> None:
        """Log why training stops, in one line: the command line prints the same error as
        one line (and its traceback only with --debug), as for errors at start-up."""
        if isinstance(error, TrainingPreempted):
            if not error.checkpoint:  # a saved stop is logged by the hook that saved it
                logger.warning(f"{preemption.signal_name(error.signum)} stopped the data-loader workers too, and "
                               f"iteration {self.iter} cannot finish without them: stopping without a new checkpoint")
        elif isinstance(error, TrainingStopped):  # an intended stop: no error
            logger.info(f"Training stopped at iteration {self.iter}: {error}")
        else:
            logger.error(f"Training stopped at iteration {self.iter}: {error}")

    def before_train(self) -> None:
        """Call ``before_train`` of every hook, then reset the CUDA peak memory (when CUDA is in use),
        so that max_mem in the log describes training, not model building or set-up."""
        for h in self._hooks:
            h.before_train()
        if torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()

    def after_train(self) -> None:
        """Call ``after_train`` of every hook (storage iteration = trainer iteration)."""
        self.storage.iter = self.iter
        for h in self._hooks:
            h.after_train()

    def flush_metrics(self) -> None:
        """Write metrics a step computed but has not fetched yet (none here; see
        SimpleTrainer). Hooks call it before they save a checkpoint or evaluate."""

    def before_step(self) -> None:
        """Align the storage iteration with the trainer's, then call the hooks."""
        self.storage.iter = self.iter
        self.warmup_step = False
        for h in self._hooks:
            h.before_step()

    def after_backward(self) -> None:
        """Call ``after_backward`` of every hook."""
        for h in self._hooks:
            h.after_backward()

    def after_step(self) -> None:
        """Call ``after_step`` of every hook."""
        for h in self._hooks:
            h.after_step()

    def run_step(self) -> None:
        """Run one iteration; implemented by subclasses."""
        raise NotImplementedError

    def step_may_be_long(self) -> bool:
        """Whether the coming step may be long enough (compiling) to be interruptible; none here."""
        return False

    def step_snapshot(self) -> Callable[[], None]:
        """Take what the coming step changes before its optimizer step; returns its undo (nothing here)."""
        return lambda: None

    def _hook_state_keys(self) -> List[str]:
        """One key per hook: its class name, ``Name#2``, ``Name#3`` for repeated classes."""
        seen: Dict[str, int] = {}
        keys = []
        for h in self._hooks:
            name = type(h).__qualname__
            seen[name] = seen.get(name, 0) + 1
            keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
        return keys

    def state_dict(self) -> dict:
        """Return ``{"iteration", "hooks": {ClassName: state}, "storage"}`` (stateless
        hooks are left out; ``storage`` only while or after training)."""
        ret: dict = {"iteration": self.iter}
        hooks_state = {}
        for key, h in zip(self._hook_state_keys(), self._hooks):
            state = h.state_dict()
            if state:
                hooks_state[key] = state
        ret["hooks"] = hooks_state
        if self._pending_storage_state is not None:  # loaded but training not started yet
            ret["storage"] = self._pending_storage_state
        elif self.storage is not None:
            ret["storage"] = self.storage.state_dict()
        return ret

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore iteration, hook states (warning about unknown ones) and the event
        histories (applied when ``train`` opens its storage)."""
        self.iter = int(state_dict["iteration"])
        hooks_by_key = dict(zip(self._hook_state_keys(), self._hooks))
        for key, value in state_dict.get("hooks", {}).items():
            hook = hooks_by_key.get(key)
            if hook is None:
                logger.warning(f"Cannot find the hook '{key}' in this trainer: its saved state is ignored")
                continue
            hook.load_state_dict(value)
        storage_state = state_dict.get("storage")
        if storage_state is not None:
            if self._training:
                self.storage.load_state_dict(storage_state)
            else:
                self._pending_storage_state = storage_state
