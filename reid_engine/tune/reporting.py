"""Report a trial's evaluations to its Optuna study, and stop the training the study prunes.

:class:`TrialReporter` is a training hook registered after the default ones (so after the
evaluation hook of the same step). At every periodic evaluation it reads the objective metric
from the trainer's event storage (the flattened result names, e.g. ``SyntheticReID/mAP``), and
on the main worker reports it with ``trial.report(value, step)`` and asks ``trial.should_prune()``.
The answer goes to every worker (one small collective), so all of them stop after the same
iteration, by raising :class:`TrainingPruned` (a clean, generic early stop of the engine).

Steps are counted in iterations completed: an evaluation after iteration index ``i`` (0-based)
is reported at step ``i + 1``; the final evaluation at step ``max_iter``.
"""
import logging
from typing import Callable, Dict, List, Optional, Tuple

from ..config import ConfigError
from ..engine.hooks import EvalHook, periodic_evaluation_due
from ..engine.trainer_base import HookBase, TrainingStopped
from ..utils import comm

__all__ = ["TrainingPruned", "TrialReporter", "resolve_metric"]

logger = logging.getLogger(__name__)


class TrainingPruned(TrainingStopped):
    """The study pruned the trial: training stopped early, on every worker at the same iteration."""


def resolve_metric(metric: str, names: List[str]) -> Optional[str]:
    """The result name that `metric` means: itself, else the one name ending in ``/<metric>``.

    Args:
        metric: the objective metric of the search space ("SyntheticReID/mAP", or "mAP" with one test set).
        names: the flattened result names of an evaluation.
    Returns:
        the name, or None when there is none or several match.
    """
    if metric in names:
        return metric
    suffixed = [n for n in names if n.endswith("/" + metric)]
    return suffixed[0] if len(suffixed) == 1 else None


class TrialReporter(HookBase):
    """Report each evaluation's objective metric to the trial; stop training when it is pruned.

    Register it on every worker, after the default hooks. ``open_trial`` is called once, on the
    main worker only, in ``before_train``; the other workers only join the collective that
    shares the decision.
    """

    def __init__(self, open_trial: Callable[[], object], metric: str, eval_period: int,
                 evaluation: Optional[EvalHook] = None):
        """
        Args:
            open_trial: returns the ``optuna.trial.Trial`` to report to (main worker only).
            metric: the objective metric (see :func:`resolve_metric`).
            eval_period: iterations between evaluations, the evaluation hook's period (0: only the final one).
            evaluation: the run's evaluation hook, registered before this one: a resumed run's
                evaluation that a stop signal had cut short, which it redoes first, is reported too.
        """
        self._open_trial = open_trial
        self._metric = metric
        self._period = int(eval_period)
        self._evaluation = evaluation
        self._trial = None
        #: (step, value) of every evaluation reported in this attempt
        self.reported: List[Tuple[int, float]] = []

    def before_train(self) -> None:
        if comm.is_main_process() and self._trial is None:
            self._trial = self._open_trial()
        redone = self._evaluation.redone if self._evaluation is not None else None
        if redone is not None:  # the evaluation hook's before_train just did it
            self._report(redone + 1, may_prune=True, written_at=redone)

    def after_step(self) -> None:
        next_iter = self.trainer.iter + 1
        if periodic_evaluation_due(next_iter, self._period, self.trainer.max_iter):  # the final one: after_train
            self._report(next_iter, may_prune=True)

    def after_train(self) -> None:
        if self.trainer.iter >= self.trainer.max_iter:  # completed: the final evaluation ran
            self._report(self.trainer.max_iter, may_prune=False)
        self._open_trial = None  # often a closure over the study: release it with the trainer

    def _report(self, step: int, may_prune: bool, written_at: Optional[int] = None) -> None:
        """Report on the main worker, then have every worker act on its decision.

        `written_at` is the storage iteration of the evaluation's results (default: the current one).
        """
        decision: Dict[str, object] = {"prune": False, "value": None, "error": None}
        if comm.is_main_process():
            decision = self._decide(step, may_prune, self.trainer.storage.iter if written_at is None else written_at)
        decision = comm.all_gather(decision)[0]  # the main worker's, on every worker
        if decision["error"]:
            raise ConfigError(decision["error"])
        self.reported.append((step, float(decision["value"])))
        if decision["prune"]:
            raise TrainingPruned(f"trial pruned ({self._metric} {decision['value']:.4g} after {step} iterations "
                                 "is not promising enough for the study's pruner)", iteration=self.trainer.iter)

    def _decide(self, step: int, may_prune: bool, written_at: int) -> Dict[str, object]:
        """Read the metric the evaluation wrote at storage iteration `written_at`, report it for
        `step`, and ask the pruner."""
        results = {name: value for name, (value, itr) in self.trainer.storage.latest().items()
                   if itr == written_at and "/" in name}  # the flattened results of this evaluation
        name = resolve_metric(self._metric, sorted(results))
        if name is None:
            existing = ", ".join(sorted(results)) or "none"
            return {"prune": False, "value": None,
                    "error": f"the objective metric '{self._metric}' is not among the evaluation results "
                             f"({existing}): set objective.metric in the search space to one of them"}
        value = float(results[name])
        self._trial.report(value, step=step)
        prune = bool(may_prune and self._trial.should_prune())
        logger.info(f"Trial #{self._trial.number}: {name} = {value:.4g} after {step} iterations"
                    + (" -> pruned" if prune else ""))
        return {"prune": prune, "value": value, "error": None}
