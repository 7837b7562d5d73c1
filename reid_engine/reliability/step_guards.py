"""The training loop's guards against stop signals and data-loader faults, as step wrappers.

The loop (``engine.TrainerBase.train``) knows them only through its step-wrapper protocol
(``engine.trainer_base.StepWrapper``) and calls every wrapper at three fixed points:

- ``watch(trainer)`` when training starts; the function it returns when training has ended;
- ``run_step(trainer, step)`` around each iteration's ``trainer.run_step`` (``step``);
- ``failure(trainer, exc)`` for an exception that ends training: the user error it means, or None.

They use the trainer's public surface only (``iter``, ``optimizer``, ``data_loader``,
``restart_data_stream``, ``step_may_be_long``, ``step_snapshot``), so a trainer that overrides
``run_step`` or ``train_on_batch`` keeps them without calling anything itself.
"""
import logging
from typing import Any, Callable, List, Optional, Sequence

import torch
from torch import nn

from ..utils.env import get_rng_states, set_rng_states
from ..utils.errors import ReidUserError
from . import loader_faults, preemption
from .preemption import TrainingPreempted

__all__ = ["LoaderFaultGuard", "InterruptibleSteps", "StepSnapshot", "default_step_wrappers"]

# The name these lines have had in log.txt since the loop lived in engine/train_loop.py.
logger = logging.getLogger("reid_engine.engine.train_loop")


class LoaderFaultGuard:
    """Dead data-loader workers: one clear line (``loader_faults.DataLoaderWorkerDied``), or, when a
    stop signal to the process group ended them too, a stop (``TrainingPreempted``) for which the main
    process loads the batches of the steps left until the workers agree on the step to save at."""

    def watch(self, trainer: Any) -> Callable[[], None]:
        """Keep a worker's death by a stop signal from being raised mid-step (``watch_loader_workers``)."""
        return loader_faults.watch_loader_workers()

    def run_step(self, trainer: Any, step: Callable[[], None]) -> None:
        """Run `step`; after a death by the stop signal this process got too, run it again with the
        batches loaded in the main process."""
        try:
            loader_faults.raise_pending_stop_death()  # a death noted mid-step fails this fetch
            step()
        except Exception as e:  # a dead worker's queued batch fails as FileNotFoundError, among others
            failure = self.failure(trainer, e)
            if failure is None:
                raise
            if not (isinstance(failure, TrainingPreempted) and loader_faults.stopped_worker(e)
                    and loader_faults.load_in_main_process(trainer)):
                raise failure from e
            logger.warning(f"{preemption.signal_name(failure.signum)} stopped the data-loader workers too: the main "
                           f"process loads the batches of iteration {trainer.iter} and of any until the agreed stop")
            step()

    def failure(self, trainer: Any, exc: BaseException) -> Optional[ReidUserError]:
        """What a dead worker means: a stop without a new checkpoint when this process got a stop
        signal too (TrainingPreempted), else DataLoaderWorkerDied; None for any other error."""
        translated = loader_faults.loader_worker_error(exc, trainer.iter)
        stop_kind = loader_faults.stopped_worker(exc)
        if translated is None and not stop_kind:
            return None
        # The worker may have died of a group's signal before this process ran its handler.
        signum = preemption.wait_for_request(loader_faults.STOP_GRACE_S if stop_kind else 0.0)
        return TrainingPreempted.stopped(signum, trainer.iter, "") if signum else translated


def _end_region(*_: Any) -> None:
    preemption.end_interruptible()


class InterruptibleSteps:
    """A step that may be long (``trainer.step_may_be_long()``: compiling, recording CUDA graphs) runs
    in an interruptible region (``preemption.interruptible``) up to its optimizer step: a stop signal
    ends it at once, ``trainer.step_snapshot()`` undoes what it changed, and the run stops with the
    checkpoint of the previous iteration. Other steps run as they are: a signal stops the run after them.

    The region ends when an optimizer of the trainer starts its step (a torch step pre-hook), as the
    weights change from there on: whatever ``run_step`` or ``train_on_batch`` does, a step is either
    undone whole or finished.
    """

    def watch(self, trainer: Any) -> Callable[[], None]:
        """Register the end of the region on the trainer's optimizer (``trainer.optimizer``, if any)."""
        optimizer = getattr(trainer, "optimizer", None)
        if not isinstance(optimizer, torch.optim.Optimizer):
            return lambda: None
        return optimizer.register_step_pre_hook(_end_region).remove

    def run_step(self, trainer: Any, step: Callable[[], None]) -> None:
        """Run `step`, interruptible when it may be long."""
        if not preemption.handling_stops() or not trainer.step_may_be_long():
            step()
            return
        # Only where the region is interruptible (one process, a job's main worker) is there a
        # stop to undo the step for; the other workers' regions only watch (preemption module doc).
        undo = trainer.step_snapshot() if preemption.can_interrupt() else None
        try:
            with preemption.interruptible("the training step"):
                step()
        except preemption.StopInterrupt as stop:
            undo()
            raise preemption.stop_interrupted(stop, trainer.iter - 1) from stop

    def failure(self, trainer: Any, exc: BaseException) -> Optional[ReidUserError]:
        """None: an interrupted step raises its TrainingPreempted itself."""
        return None


def default_step_wrappers() -> List[Any]:
    """The wrappers every trainer starts with: loader faults outermost, then interruptible steps."""
    return [LoaderFaultGuard(), InterruptibleSteps()]


class StepSnapshot:
    """What a training step changes before its optimizer step, taken before it fetches its batch, so that
    an interrupted step can be undone: the model's buffers (the BatchNorm statistics the forward pass
    updates), every RNG, the data stream's position and the states of `stateful` objects (a batched
    augmentation's draws, a gradient scaler). The parameters and the optimizer's state change only in
    the optimizer step, which is out of the interruptible part; gradients are in no checkpoint.
    """

    def __init__(self, model: nn.Module, data_stream: Any = None, stateful: Sequence[Any] = ()):
        self.buffers = list(model.buffers())
        self.saved = [b.detach().clone() for b in self.buffers]
        self.rng = get_rng_states()
        self.stream = data_stream.state_dict() if hasattr(data_stream, "state_dict") else None
        self.states = [(obj, obj.state_dict()) for obj in stateful if obj is not None]

    def restore(self) -> Optional[dict]:
        """Put everything back as it was at the snapshot.

        Returns:
            the data stream's position then (None: not resumable). A started stream cannot rewind,
            so the trainer's checkpoint holds this position instead (the stop ends the run anyway).
        """
        if self.buffers:
            with torch.no_grad():
                torch._foreach_copy_(self.buffers, self.saved)
        set_rng_states(self.rng)
        for obj, state in self.states:
            obj.load_state_dict(state)
        return self.stream
