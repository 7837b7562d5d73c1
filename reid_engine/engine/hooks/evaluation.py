"""The evaluation hook and the flattening of nested results into scalars."""
import logging
from typing import Callable, Dict, Mapping, Optional

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
        self.trainer.flush_metrics()  # a NaN loss stops the run before evaluating its weights
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
        if periodic_evaluation_due(self.trainer.iter + 1, self._period, self.trainer.max_iter):
            self._do_eval()

    def after_train(self):
        # trainer.iter reaches max_iter only when the last step completed (a run that failed
        # in its last step, e.g. on a NaN loss, is not evaluated).
        if self.trainer.iter >= self.trainer.max_iter:
            self._do_eval()
        # The function is often a closure holding the trainer: release it.
        self._func = None
