"""The evaluation hook and the flattening of nested results into scalars."""
import logging
from typing import Callable, Dict, Mapping, Optional

from ...reliability import preemption
from ...utils import comm
from ..train_loop import HookBase

logger = logging.getLogger(__name__)


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


def periodic_evaluation_due(next_iter: int, period: int, max_iter: int) -> bool:
    """Whether :class:`EvalHook` evaluates after the step that completes `next_iter` iterations.

    Every `period` iterations, except after the last step: the final evaluation runs in
    ``after_train``. Hooks that act on an evaluation's results (the best checkpoint, reid-tune's
    reporter) ask this too, so that they follow the evaluations exactly.
    """
    return period > 0 and next_iter % period == 0 and next_iter != max_iter


class EvalHook(HookBase):
    """Run ``eval_function()`` when ``(iter + 1) % eval_period == 0`` (except at the
    last iteration) and once after training, if training completed. Results (a nested
    dict of floats) are flattened with ``/`` into the storage.

    An evaluation may take minutes (a first compiled one recompiles, big galleries): it runs
    in an interruptible region (``reliability.preemption``), so a stop signal ends it at once and
    the Preemption hook saves the checkpoint of the evaluated iteration, whose weights a
    finished step left. That checkpoint records the evaluation as pending (this hook's
    state), and the resumed run does a periodic one first, in ``before_train``, with its
    results at their own iteration (where the BestCheckpointer looks at them too). A stop in
    the final evaluation saves ``model_final`` with it pending (``pending`` is then the last
    iteration): it is done by the ``after_train`` of a run that completes, so a resumed run
    with nothing left to train must still run its hooks' ``after_train`` (the trainer's part).

    Attributes:
        pending: the iteration whose evaluation a stop cut short (None: none).
        redone: the iteration whose cut-short evaluation this run did first, in
            ``before_train`` (None: none), for hooks that report evaluations (a trial's pruner).
    """

    def __init__(self, eval_period: int, eval_function: Callable[[], Optional[Mapping]]):
        """
        Args:
            eval_period: iterations between evaluations; 0 evaluates only at the end.
            eval_function: takes no argument, returns a nested dict of floats (or
                None/empty on workers with nothing to report).
        """
        self._period = eval_period
        self._func = eval_function
        self.pending: Optional[int] = None
        self.redone: Optional[int] = None

    def _do_eval(self, iteration: int) -> None:
        """Evaluate the weights of the finished `iteration`; a stop signal during it saves
        that iteration's checkpoint with the evaluation pending and raises TrainingPreempted."""
        self.trainer.flush_metrics()  # a NaN loss stops the run before evaluating its weights
        try:
            with preemption.interruptible("the evaluation"):
                results = self._func()
        except preemption.StopInterrupt as stop:
            self.pending = iteration  # in the checkpoint saved now: the resumed run evaluates first
            raise preemption.stop_interrupted(stop, iteration) from stop
        self.pending = None
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

    def before_train(self):
        # A periodic evaluation a stop cut short (a final one is after_train's, of a completed run).
        if self.pending is None or self.pending >= min(self.trainer.start_iter, self.trainer.max_iter - 1):
            return
        storage = self.trainer.storage
        logger.info(f"Evaluating the weights of iteration {self.pending} first: a stop signal cut that "
                    "evaluation short")
        storage.iter = self.pending  # its results belong to the iteration evaluated
        redone = self.pending
        try:
            self._do_eval(redone)
        finally:
            storage.iter = self.trainer.start_iter
        self.redone = redone

    def after_step(self):
        if periodic_evaluation_due(self.trainer.iter + 1, self._period, self.trainer.max_iter):
            self._do_eval(self.trainer.iter)

    def after_train(self):
        try:
            # trainer.iter reaches max_iter only when the last step completed (a run that failed
            # in its last step, e.g. on a NaN loss, is not evaluated).
            if self.trainer.iter >= self.trainer.max_iter:
                self._do_eval(self.trainer.iter - 1)
        except preemption.TrainingPreempted as stop:
            # Raised by the Preemption hook after its own after_train: the hooks after this one
            # (writers, the best checkpoint) still end their training.
            preemption.defer_stop(stop)
        finally:
            # The function is often a closure holding the trainer: release it.
            self._func = None

    def state_dict(self) -> dict:
        """``{"pending": iteration}`` while an evaluation a stop cut short is to be done, else {}."""
        return {"pending": self.pending} if self.pending is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the pending evaluation."""
        pending = state_dict.get("pending")
        self.pending = None if pending is None else int(pending)
