"""Checkpoint hooks: periodic checkpoints, the best-metric checkpoint, and a checkpoint on preemption."""
import logging
import math
import os
from typing import Optional

from ...reliability import preemption
from ...utils import comm
from ...utils.checkpoint import PeriodicCheckpointer as _PeriodicCheckpointerBase
from ..train_loop import HookBase
from .evaluation import periodic_evaluation_due

logger = logging.getLogger(__name__)


class PeriodicCheckpointer(_PeriodicCheckpointerBase, HookBase):
    """Save ``model_{iter:07d}.pth`` when ``(iter + 1) % period == 0`` and
    ``model_final.pth`` at the last iteration (see utils.checkpoint.PeriodicCheckpointer
    for keep-last-N). ``max_iter`` comes from the trainer."""

    def before_train(self):
        self.max_iter = self.trainer.max_iter

    def after_step(self):
        iteration = self.trainer.iter
        if (iteration + 1) % self.period == 0 or (self.max_iter is not None and iteration >= self.max_iter - 1):
            self.trainer.flush_metrics()  # a NaN loss raises here, before its weights are saved
        self.step(iteration)


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

    def _best_checking(self, iteration: Optional[int] = None) -> None:
        """Look at the metric the evaluation of `iteration` (default: the storage's) wrote."""
        storage = self.trainer.storage
        iteration = storage.iter if iteration is None else iteration
        entry = storage.latest().get(self._val_metric)
        if entry is None or entry[1] != iteration:
            logger.warning(f"BestCheckpointer: metric '{self._val_metric}' was not written at iteration "
                           f"{iteration}; is the EvalHook registered before it and the name right?")
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

    def before_train(self):
        # A value before the first step is the evaluation a stop cut short, which the EvalHook
        # redid first (a resumed run's storage holds no latest values of its own).
        entry = self.trainer.storage.latest().get(self._val_metric)
        if entry is not None:
            self._best_checking(entry[1])

    def after_step(self):
        if periodic_evaluation_due(self.trainer.iter + 1, self._period, self.trainer.max_iter):
            self._best_checking()

    def after_train(self):
        # Only after a completed run (iter == max_iter), as the EvalHook's final evaluation:
        # neither a step that failed nor a stop in the final evaluation left a value to look at.
        if self.trainer.iter >= self.trainer.max_iter:
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


class Preemption(HookBase):
    """Stop cleanly on SIGTERM / SIGUSR1 / SIGINT: finish the current step, save a
    checkpoint through the run's :class:`PeriodicCheckpointer` (atomically, named like a
    periodic one, and ``last_checkpoint`` names it), then raise
    :class:`~reid_engine.reliability.preemption.TrainingPreempted`.

    Register it on every worker, after the PeriodicCheckpointer: after each step the
    workers agree on whether anyone was signalled (one tiny all-reduce, read one step
    later so that no step waits for it), so every worker stops after the same step (the
    one after the signal when there are several workers) and the saved state is that of
    one iteration. A request in
    the last step lets the run complete (its final checkpoint is already written). The
    signal handlers are installed in ``before_train`` and put back in ``after_train``.

    Work that may last minutes (a compiling step, an evaluation) runs in interruptible
    regions (``reliability.preemption.interruptible``): a signal there ends it at once, its owner
    puts back the state of the last finished iteration and this hook saves that iteration's
    checkpoint (:meth:`_stop_interrupted`: named as above, ``model_final`` for the last
    iteration, ``model_start`` for the state before a new run's first step) without any
    collective, so that the main worker of a job can stop alone. In a job the losses the
    workers staged since the last write are then not written (gathering them is a collective).
    """

    def __init__(self, periodic: PeriodicCheckpointer):
        """
        Args:
            periodic: the run's periodic checkpointer hook (its checkpointer, period,
                file prefix); on workers that write no files it saves nothing.
        """
        self._periodic = periodic
        self._restore = None
        self._noticed = 0
        self._interrupted = False
        self._agreement = preemption.StopAgreement()

    def before_train(self):
        self._noticed = 0
        self._interrupted = False
        self._agreement = preemption.StopAgreement()
        self._restore = preemption.install_stop_handlers(on_interrupt=self._stop_interrupted)

    def after_train(self):
        if not self._interrupted:  # an interrupted main worker must not wait for the others
            self._agreement.finish()  # the last step's all-reduce, posted on every worker
        if self._restore is not None:
            self._restore()
            self._restore = None
        deferred = preemption.take_deferred_stop()  # a stop in the final evaluation
        if deferred is not None:
            raise deferred

    def after_step(self):
        local = preemption.requested_signal()
        if local and not self._noticed:
            self._noticed = local
            logger.warning(f"Received {preemption.signal_name(local)} during iteration {self.trainer.iter}: saving a "
                           "checkpoint after this step, then stopping (send it again to stop at once)")
        signum = self._agreement.exchange(local)
        if not signum:
            return
        iteration = self.trainer.iter
        if iteration >= self.trainer.max_iter - 1:
            logger.warning(f"{preemption.signal_name(signum)} in the last iteration: the run completes "
                           "(send the signal again to stop at once)")
            return
        logger.info(f"Stopping after iteration {iteration} on every worker ({preemption.signal_name(signum)})")
        self.trainer.flush_metrics()  # a collective: every worker is here, at this iteration
        path = self._save(iteration)
        comm.synchronize()  # no worker exits (and gets its launcher to stop the others) mid-save
        raise preemption.TrainingPreempted.stopped(signum, iteration, path)

    def _stop_interrupted(self, signum: int, iteration: int) -> preemption.TrainingPreempted:
        """After a signal interrupted a region (a step, an evaluation) and the trainer holds
        the state of the finished `iteration` again: save its checkpoint, without any
        collective, and return the error to raise (``preemption.stop_interrupted`` calls this).

        Args:
            signum: the signal.
            iteration: the last finished iteration (-1: none yet, a new run's first step).
        """
        self._interrupted = True
        self.trainer.iter = iteration  # the iteration the checkpoint holds: a resume starts after it
        if comm.get_world_size() == 1:  # a collective in a job, where this worker stops alone
            self.trainer.flush_metrics()
        return preemption.TrainingPreempted.stopped(signum, iteration, self._save(iteration, always=True))

    def _save(self, iteration: int, always: bool = False) -> str:
        """Save this iteration's checkpoint unless the periodic schedule just did (`always`:
        even then, the state may differ, e.g. by an evaluation still to run); returns its path."""
        periodic = self._periodic
        checkpointer = periodic.checkpointer
        if iteration < 0:
            name = f"{periodic.file_prefix}_start"
        elif always and iteration >= self.trainer.max_iter - 1:
            name = f"{periodic.file_prefix}_final"  # the name the last iteration's checkpoint has
        else:
            name = f"{periodic.file_prefix}_{iteration:07d}"
        if always or (iteration + 1) % periodic.period != 0:
            checkpointer.save(name, iteration=iteration)
        return os.path.join(checkpointer.save_dir, f"{name}.pth")
