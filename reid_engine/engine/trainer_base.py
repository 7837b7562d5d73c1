"""The generic training loop: hooks (:class:`HookBase`) and the trainer that calls them (:class:`TrainerBase`).

The order of hook calls and what the trainer's state dict holds (for exact resume) are the
contract every trainer and hook builds on; the step itself is ``engine.train_loop``'s.
"""
import logging
import weakref
from typing import Dict, Iterable, List, Mapping, Optional

import torch

from ..reliability import loader_faults, preemption
from ..reliability.preemption import TrainingPreempted
from ..utils.errors import ReidUserError
from ..utils.events import EventStorage

__all__ = ["HookBase", "TrainerBase", "TrainingStopped"]

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
        """Run iterations ``start_iter`` .. ``max_iter - 1`` with the hooks.

        Args:
            start_iter, max_iter: the iterations.
            hooks_only: with ``start_iter == max_iter``, run no step but the hooks' ``before_train``
                and ``after_train`` of a completed run (a final evaluation a stop signal cut short).
        Raises:
            ValueError: when ``start_iter >= max_iter`` (but for ``hooks_only`` and equal ones).
            ReidUserError: raised inside (a hook, a re-clustering, a loader), logged as one
                line without its traceback (any other exception is logged with it);
                DataLoaderWorkerDied for a dead loader worker; TrainingPreempted for a stop
                signal, also one that reached the loader workers (a process group's);
                TrainingStopped for a hook's intended early stop (logged at INFO).
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
        with EventStorage(start_iter) as self.storage:
            if self._pending_storage_state is not None:
                self.storage.load_state_dict(self._pending_storage_state)
                self._pending_storage_state = None
            self._training = True
            unwatch_workers = loader_faults.watch_loader_workers()
            try:
                self.before_train()
                if torch.cuda.is_initialized():
                    # max_mem in the log then describes training, not model building or set-up.
                    torch.cuda.reset_peak_memory_stats()
                for self.iter in range(start_iter, max_iter):
                    self.before_step()
                    self._run_step_through_stop()
                    self.after_step()
                self.flush_metrics()  # a bad loss staged in the last steps fails the run here
                # One past the last step, so hooks can tell a completed run from a failed one.
                self.iter = max_iter
            except Exception as e:
                failure = e if isinstance(e, ReidUserError) else self._worker_death(e)
                if failure is None:  # a bug, not a user error: keep its traceback
                    logger.exception(f"Exception during training at iteration {self.iter}:")
                    raise
                self._log_stop(failure)
                if failure is e:
                    raise
                raise failure from e
            finally:
                try:
                    self.after_train()
                finally:
                    unwatch_workers()
                    self._training = False

    def _run_step_through_stop(self) -> None:
        """``run_step``; when its data-loader workers died of the stop signal this process
        got too (a signal to the process group), the main process loads the batches of
        the steps left until the stop hook has every worker agree on the step to save at."""
        try:
            loader_faults.raise_pending_stop_death()  # a death noted mid-step fails this fetch
            self.run_step()
        except Exception as e:  # a dead worker's queued batch fails as FileNotFoundError, among others
            failure = self._worker_death(e)
            if failure is None:
                raise
            if not (isinstance(failure, TrainingPreempted) and loader_faults.stopped_worker(e)
                    and loader_faults.load_in_main_process(self)):
                raise failure from e
            logger.warning(f"{preemption.signal_name(failure.signum)} stopped the data-loader workers too: the main "
                           f"process loads the batches of iteration {self.iter} and of any until the agreed stop")
            self.run_step()

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

    def _worker_death(self, exc: BaseException) -> Optional[ReidUserError]:
        """What a dead data-loader worker means: a stop without a new checkpoint when this
        process got a stop signal too (TrainingPreempted), else DataLoaderWorkerDied.

        Returns:
            None when `exc` is no dead-worker error (nor an error of a fetch during a stop).
        """
        translated = loader_faults.loader_worker_error(exc, self.iter)
        stop_kind = loader_faults.stopped_worker(exc)
        if translated is None and not stop_kind:
            return None
        # The worker may have died of a group's signal before this process ran its handler.
        signum = preemption.wait_for_request(loader_faults.STOP_GRACE_S if stop_kind else 0.0)
        return TrainingPreempted.stopped(signum, self.iter, "") if signum else translated

    def before_train(self) -> None:
        """Call ``before_train`` of every hook."""
        for h in self._hooks:
            h.before_train()

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
