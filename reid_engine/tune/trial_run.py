"""One trial = one ordinary training run of the base command with the trial's values, in its folder
(a retry: the folder of the trial it retries, resumed from its checkpoint), recorded in ``trial.json``;
its evaluations reported to the study (main worker), which may stop it on every worker at once."""
import argparse
import copy
import dataclasses
import functools
import json
import logging
import math
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch.multiprocessing as mp

from ..config import CfgNode, ConfigError
from ..engine.config_checks import check_config_values
from ..engine.defaults import DefaultTrainer
from ..engine.hooks import EvalHook, periodic_evaluation_due
from ..engine.launch import launch
from ..engine.trainer_base import HookBase, TrainingStopped
from ..reliability.preemption import TrainingPreempted, signal_name
from ..utils import comm
from ..utils.errors import ReidUserError, user_error_of_traceback
from ..utils.file_io import atomic_write_text
from ..utils.logger import close_log_file, setup_run_logging
from .space import SearchSpace, overrides_list, suggest_overrides
from .study import TrialFailed, open_storage, require_optuna, retry_of

__all__ = ["TRIAL_RECORD", "TrainingPruned", "TrialReporter", "TrialBase", "TrialRef", "StoredTrial", "TrialTrainer",
           "run_trial", "trial_output_dir", "read_record"]

logger = logging.getLogger(__name__)

TRIAL_RECORD = "trial.json"


class TrainingPruned(TrainingStopped):
    """The study pruned the trial: training stopped early, on every worker at the same iteration."""


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
        name = self._metric
        if name not in results:
            return {"prune": False, "value": None,
                    "error": f"the objective metric '{name}' is not among the evaluation results "
                             f"({', '.join(sorted(results)) or 'none'}): set objective.metric in the search space "
                             "to one of them"}
        value = float(results[name])
        self._trial.report(value, step=step)
        prune = bool(may_prune and self._trial.should_prune())
        logger.info(f"Trial #{self._trial.number}: {name} = {value:.4g} after {step} iterations"
                    + (" -> pruned" if prune else ""))
        return {"prune": prune, "value": value, "error": None}


@dataclasses.dataclass(frozen=True)
class TrialBase:
    """The base command of a search (reid-train's args, cfg, launch options, worker), the study's storage and
    the study's `log_file` this process returns to after a trial."""

    args: argparse.Namespace
    cfg: CfgNode
    launch_options: Dict[str, Any]
    train_worker: Callable[..., Any]
    storage_url: str = ""
    heartbeat_s: float = 60.0
    log_file: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class TrialRef:
    """A picklable reference to a running trial for its training workers."""

    storage_url: str
    heartbeat_s: float
    study_name: str
    number: int
    pruner: Any
    metric: str
    record: str
    resume_with: str


class StoredTrial:
    """A running trial's ``number``, ``report`` and ``should_prune`` through the storage's public API, for the
    main training worker, in this process or a spawned one (an Optuna trial cannot be sent there)."""

    def __init__(self, ref: TrialRef):
        self.number, self._db = ref.number, open_storage(ref.storage_url, ref.heartbeat_s)
        self._study = require_optuna().load_study(study_name=ref.study_name, storage=self._db, pruner=ref.pruner)
        self._id = self._db.get_trial_id_from_study_id_trial_number(self._db.get_study_id_from_name(ref.study_name),
                                                                     ref.number)

    def report(self, value: float, step: int) -> None:
        """Record an intermediate value (a step already reported keeps its first value, as Trial.report)."""
        if step not in self._db.get_trial(self._id).intermediate_values:
            self._db.set_trial_intermediate_value(self._id, step, value)

    def should_prune(self) -> bool:
        """The study's pruner on the trial as stored."""
        return bool(self._study.pruner.prune(self._study, self._db.get_trial(self._id)))


class TrialTrainer(DefaultTrainer):
    """DefaultTrainer plus the :class:`TrialReporter` hook, recording how the run ended in ``trial.json``."""

    def __init__(self, cfg: CfgNode, trial_ref: TrialRef):
        self.trial_ref, self.reporter = trial_ref, None  # before DefaultTrainer.__init__, which builds the hooks
        super().__init__(cfg)

    def build_hooks(self) -> list:
        """The default hooks, then the trial's reporter (it reads what this step's evaluation wrote)."""
        ret = super().build_hooks()
        self.reporter = TrialReporter(functools.partial(StoredTrial, self.trial_ref), self.trial_ref.metric,
                                      self.cfg.TEST.EVAL_PERIOD * self.iters_per_epoch,
                                      next((h for h in ret if isinstance(h, EvalHook)), None))
        return ret + [self.reporter]

    def _final_evaluation_pending(self) -> bool:
        # A complete run here is a trial killed between its final checkpoint and its result:
        # evaluate that checkpoint (DefaultTrainer would refuse: "nothing to train").
        return True

    def train(self):
        """Train like DefaultTrainer; the main worker then writes the outcome into ``trial.json``."""
        try:
            results = super().train()
        except TrainingPruned as e:
            self._record("pruned", e.iteration + 1)
            raise
        except TrainingPreempted as e:
            # With its checkpoint the stop's iteration is done; without, it is the one interrupted.
            self._record("preempted", e.iteration + 1 if e.checkpoint else e.iteration, checkpoint=e.checkpoint,
                         signal=signal_name(e.signum) if e.signum else "")
            raise
        except Exception:
            self._record("failed", self.iter)
            raise
        final = self.reporter.reported[-1] if self.reporter.reported else None
        self._record("complete", self.iter, value=final[1] if final and final[0] == self.max_iter else None)
        return results

    def _record(self, status: str, iterations: int, **fields) -> None:
        if comm.is_main_process():
            update_record(self.trial_ref.record, status=status, iterations=int(iterations),
                          evaluations=[list(r) for r in self.reporter.reported], **fields)


def _trial_worker(train_worker: Callable[..., Any], args: argparse.Namespace, cfg: CfgNode, ref: TrialRef) -> None:
    """One training worker: reid-train's job with :class:`TrialTrainer`; a pruned or preempted run ends quietly."""
    try:
        train_worker(args, cfg, trainer_class=functools.partial(TrialTrainer, trial_ref=ref),
                     resume_with=ref.resume_with)
    except (TrainingPruned, TrainingPreempted):
        pass


def trial_output_dir(study_dir: str, number: int) -> str:
    """The folder of trial `number` of the study whose folder is `study_dir`."""
    return os.path.join(study_dir, "trials", f"trial_{number:04d}")


def read_record(path: str) -> Dict[str, Any]:
    """The content of a ``trial.json`` ({} when missing or unreadable)."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def update_record(path: str, **fields) -> Dict[str, Any]:
    """Merge `fields` into the ``trial.json`` at `path` (written atomically); returns the new content."""
    record = {**read_record(path), **fields}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return record


def _failure_line(error: BaseException) -> str:
    """The one-line error of a failed training (a worker's traceback: its last line's message)."""
    if isinstance(error, ReidUserError):
        return str(error)
    if not isinstance(error, mp.ProcessRaisedException):
        logger.exception("Training failed with an unexpected error")
        return f"{type(error).__name__}: {error}"
    text = str(error).strip()
    user_error = user_error_of_traceback(text)
    if user_error is None:
        logger.error("A training worker failed:\n%s", text)
    return user_error[1] if user_error else text.splitlines()[-1] if text else "a worker process failed"


def run_trial(trial, space: SearchSpace, base: TrialBase, study_dir: str) -> float:
    """Train one trial (the base command with its values, in its folder); returns the final evaluation's
    metric, or raises optuna.TrialPruned, TrialFailed (one line) or TrainingPreempted (checkpoint saved)."""
    original, history = retry_of(trial.study.get_trials(deepcopy=False)[trial.number])
    resumes = history[-1] if history else None  # a retry trains in the folder of the trial it retries
    output_dir = trial_output_dir(study_dir, trial.number if original is None else original)
    seed = trial.user_attrs.get("seed")  # a retry inherits it; trials differ only by their values
    if seed is None:
        seed = int(base.cfg.SEED) if base.cfg.SEED >= 0 else \
            int(np.random.SeedSequence([trial.number, 0x7E5D]).generate_state(1)[0] % (2**31))
    trial.set_user_attr("output_dir", output_dir)
    trial.set_user_attr("seed", int(seed))
    params = suggest_overrides(trial, space)
    os.makedirs(output_dir, exist_ok=True)
    record = os.path.join(output_dir, TRIAL_RECORD)
    atomic_write_text(record, json.dumps({"study": trial.study.study_name, "trial": trial.number,  # this attempt's
                                          "resumes_trial": resumes, "params": params, "seed": int(seed),
                                          "output_dir": output_dir, "status": "running"}, indent=2) + "\n")
    logger.info("Trial #%d%s trains in %s", trial.number,
                f" (continues #{resumes} from its last checkpoint)" if resumes is not None else "", output_dir)

    def ended(status: str, error: str = "") -> Dict[str, Any]:
        """The attempt's record, its status, error and iterations copied into the trial's user attrs."""
        state = update_record(record, status=status, **({"error": error} if error else {}))
        for key, value in (("status", status), ("error", " ".join(error.split())[:500]),
                           ("iterations", state.get("iterations"))):
            if value not in (None, ""):
                trial.set_user_attr(key, value)
        return state

    extra = overrides_list(params) + ["OUTPUT_DIR", output_dir, "SEED", str(seed)]
    args = copy.copy(base.args)
    args.opts, args.resume, args.eval_only = list(base.args.opts or []) + extra, resumes is not None, False
    cfg = base.cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(extra)
    cfg.freeze()
    try:
        check_config_values(cfg)  # values valid one by one may still clash: this trial fails, the study goes on
    except ReidUserError as e:
        ended("failed", str(e))
        raise TrialFailed(str(e)) from None
    ref = TrialRef(base.storage_url, base.heartbeat_s, trial.study.study_name, trial.number, trial.study.pruner,
                   space.objective.metric, record, f"the same reid-tune command (run again, or by another worker of "
                   f"the study, it continues trial #{trial.number} from this checkpoint)")
    try:
        launch(_trial_worker, base.args.num_gpus, args=(base.train_worker, args, cfg, ref), **base.launch_options)
    except Exception as e:  # a failed training (a worker's: ProcessRaisedException): this trial fails
        error = _failure_line(e)
        ended("failed", error)
        raise TrialFailed(error) from None
    finally:
        if base.log_file is not None:  # back to the study's log; the trial's file closes
            setup_run_logging(base.log_file)
            close_log_file(output_dir)
    status = read_record(record).get("status")
    state = ended(status or "failed")
    if status == "complete" and state.get("value") is not None and math.isfinite(state["value"]):
        return float(state["value"])
    if status == "pruned":
        raise require_optuna().TrialPruned()
    if status == "preempted":
        raise TrainingPreempted(f"trial #{trial.number} stopped by {state.get('signal') or 'a signal'} after "
                                f"{state.get('iterations', '?')} iterations (checkpoint: "
                                f"{state.get('checkpoint') or 'none new (it continues from the last one)'}): run the "
                                f"same reid-tune command again (or let another worker of the study) to continue "
                                f"trial #{trial.number} from its checkpoint",
                                iteration=int(state.get("iterations", 0)) - 1, checkpoint=state.get("checkpoint", ""))
    error = f"the training of trial #{trial.number} ended without an objective value (status {status!r} in {record})"
    ended("failed", error)
    raise TrialFailed(error)
