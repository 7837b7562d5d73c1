"""Report a trial's evaluations to its Optuna study (main worker) and stop, on every worker at the same
iteration, the training the study prunes."""
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
    """The result name `metric` means among `names`: itself, else the only one ending in ``/<metric>``."""
    if metric in names:
        return metric
    suffixed = [n for n in names if n.endswith("/" + metric)]
    return suffixed[0] if len(suffixed) == 1 else None


class TrialReporter(HookBase):
    """Report each evaluation's objective metric (step: the iterations done) to the trial that `open_trial`
    returns (main worker); stop training when it is pruned. `evaluation`'s redone evaluation is reported too."""

    def __init__(self, open_trial: Callable[[], object], metric: str, eval_period: int,
                 evaluation: Optional[EvalHook] = None):
        self._open_trial, self._metric, self._period, self._evaluation = open_trial, metric, int(eval_period), evaluation
        self._trial = None
        self.reported: List[Tuple[int, float]] = []  # (step, value) of each evaluation of this attempt

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
