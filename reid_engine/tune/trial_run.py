"""One trial of a search = one ordinary training run of the base command, with the trial's values.

:func:`run_trial` takes a claimed Optuna trial, asks it for its values (``space.suggest_overrides``)
and trains the base config with them merged in, the way ``reid-train`` does: the config is built
and checked here, then ``engine.launch`` starts the workers (``--num-gpus``), and each runs
reid-train's ``train_worker`` with :class:`TrialTrainer`, a DefaultTrainer whose last hook is
:class:`~reid_engine.tune.reporting.TrialReporter` (it reports every evaluation to the study and
stops a pruned run). Several trials run one after the other in one process: each gets its own
folder, log, seed and trainer, and nothing of one stays behind for the next.

Each trial's folder, ``<study folder>/trials/trial_<number>`` (a continuation: the folder of the
trial it continues), holds the run's usual files and ``trial.json``: study, trial number, values,
seed, ``resumes_trial``, and at the end ``status`` (complete / pruned / failed / preempted), the
objective ``value``, ``iterations`` and the ``evaluations`` this attempt reported ([iteration, value]).

Trial user attrs set here: ``output_dir``, ``seed``, and ``iterations``: the training iterations
of the trial, each counted once over all its attempts. An attempt stopped by SIGTERM saved its
checkpoint at the stop, so its continuation starts right after it; after a kill -9 the
continuation repeats the iterations since the last checkpoint, and they are counted once. It is
therefore the number of the last iteration trained (``max_iter`` for a completed trial).

Training runs in spawned worker processes when there are several: an Optuna trial cannot be
pickled, so they get a :class:`TrialRef` (storage URL, study name, trial id) and the main worker
opens the trial from the storage itself. A single worker runs in this process and uses the trial
it was given.

This package sits below the command line: reid-train's worker function comes in with
:class:`TrialBase` (``cli.tune`` builds it), so nothing here imports ``reid_engine.cli``.
"""
import argparse
import copy
import dataclasses
import functools
import json
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch.multiprocessing as mp

from ..config import CfgNode
from ..engine.config_checks import check_config_values
from ..engine.defaults import DefaultTrainer
from ..engine.hooks import EvalHook
from ..engine.launch import launch
from ..reliability.preemption import TrainingPreempted, signal_name
from ..utils import comm
from ..utils.errors import ReidUserError, UsageError, user_error_of_traceback
from ..utils.file_io import atomic_write_text
from ..utils.logger import close_log_file, setup_run_logging
from .reporting import TrainingPruned, TrialReporter
from .space import SearchSpace, overrides_list, suggest_overrides
from .study import TrialOutcome, open_storage, require_optuna, storage_url

__all__ = ["TRIAL_RECORD", "TrialBase", "TrialRef", "TrialTrainer", "run_trial", "trial_output_dir", "read_record"]

logger = logging.getLogger(__name__)

#: the file in each trial folder that describes the trial and how it ended
TRIAL_RECORD = "trial.json"
#: the trials' folders, inside the study folder
TRIALS_FOLDER = "trials"

# The trials this process runs itself (one worker): the reporter uses them instead of opening
# the storage again (which an in-memory storage could not do). Entries live as long as the run.
_LIVE_TRIALS: Dict[int, Any] = {}


@dataclasses.dataclass(frozen=True)
class TrialBase:
    """The base command of a search, what every trial trains with its own values merged in.

    Attributes:
        args: reid-train's parsed arguments of the base command (config file, KEY VALUE opts,
            launch flags); each trial copies them and appends its values, OUTPUT_DIR and SEED.
        cfg: the base config, built from them and checked.
        launch_options: keyword arguments of ``engine.launch`` (machines, rendezvous, backend).
        train_worker: reid-train's worker function, ``train_worker(args, cfg, trainer_class=,
            resume_with=)``; module level, so that spawned workers can receive it.
        log_file: the log this process goes back to after each trial (the study's), or None.
    """

    args: argparse.Namespace
    cfg: CfgNode
    launch_options: Dict[str, Any]
    train_worker: Callable[..., Any]
    log_file: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class TrialRef:
    """A picklable reference to a running trial, for the training workers.

    Attributes:
        storage_url: the study's database URL ("" for a storage that only this process sees).
        heartbeat_s: the storage's heartbeat interval (seconds).
        study_name, trial_id, number: which trial.
        pruner: the study's pruner (Optuna pruners pickle).
        metric: the objective metric.
        record: the trial's ``trial.json``.
        resume_with: how the trial continues after a stop, for the stop's log line.
    """

    storage_url: str
    heartbeat_s: float
    study_name: str
    trial_id: int
    number: int
    pruner: Any
    metric: str
    record: str
    resume_with: str

    def open(self):
        """The ``optuna.trial.Trial`` to report to: the live one of this process, else one opened
        from the storage (call it on the main worker only)."""
        live = _LIVE_TRIALS.get(self.trial_id)
        if live is not None:
            return live
        if not self.storage_url:
            raise UsageError("training a trial in several worker processes needs a database study storage: "
                             "give --storage a database URL (the default SQLite file works)")
        optuna = require_optuna()
        study = optuna.load_study(study_name=self.study_name, storage=open_storage(self.storage_url, self.heartbeat_s),
                                  pruner=self.pruner)
        return optuna.trial.Trial(study, self.trial_id)


class TrialTrainer(DefaultTrainer):
    """DefaultTrainer plus the :class:`TrialReporter` hook, recording how the run ended in ``trial.json``."""

    def __init__(self, cfg: CfgNode, trial_ref: TrialRef):
        self.trial_ref = trial_ref  # before DefaultTrainer.__init__, which builds the hooks
        self.reporter: Optional[TrialReporter] = None
        super().__init__(cfg)

    def build_hooks(self) -> list:
        """The default hooks, then the trial's reporter (it reads what this step's evaluation wrote)."""
        ret = super().build_hooks()
        evaluation = next((h for h in ret if isinstance(h, EvalHook)), None)
        self.reporter = TrialReporter(self.trial_ref.open, self.trial_ref.metric,
                                      self.cfg.TEST.EVAL_PERIOD * self.iters_per_epoch, evaluation)
        ret.append(self.reporter)
        return ret

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
        value = final[1] if final is not None and final[0] == self.max_iter else None
        self._record("complete", self.iter, value=value)
        return results

    def _record(self, status: str, iterations: int, **fields) -> None:
        if comm.is_main_process():
            update_record(self.trial_ref.record, status=status, iterations=int(iterations),
                          evaluations=[list(r) for r in self.reporter.reported], **fields)


def _trial_worker(train_worker: Callable[..., Any], args: argparse.Namespace, cfg: CfgNode, ref: TrialRef) -> None:
    """One training worker of a trial: reid-train's job with :class:`TrialTrainer`.

    A pruned or preempted run ends here without an exception: every worker stopped at the same
    iteration and the main one wrote the outcome, so all of them can leave together. Other
    errors go on (the launcher stops the other workers and reports the failure).
    """
    trainer_class = functools.partial(TrialTrainer, trial_ref=ref)
    try:
        train_worker(args, cfg, trainer_class=trainer_class, resume_with=ref.resume_with)
    except (TrainingPruned, TrainingPreempted):
        pass


def trial_output_dir(study_dir: str, number: int) -> str:
    """The folder of trial `number` of the study whose folder is `study_dir`."""
    return os.path.join(study_dir, TRIALS_FOLDER, f"trial_{number:04d}")


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
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=False) + "\n")
    return record


def _derived_seed(number: int) -> int:
    """A seed for trial `number` when the base config asks for a random one (SEED < 0)."""
    return int(np.random.SeedSequence([int(number), 0x7E5D]).generate_state(1)[0] % (2**31))


def _trial_config(base: TrialBase, params: Dict[str, Any], output_dir: str, seed: int,
                  resume: bool) -> Tuple[argparse.Namespace, CfgNode, List[str]]:
    """reid-train's arguments and checked config of a trial (raises the config's one-line error)."""
    extra = overrides_list(params) + ["OUTPUT_DIR", output_dir, "SEED", str(seed)]
    args = copy.copy(base.args)
    args.opts = list(base.args.opts or []) + extra
    args.resume = bool(resume)
    args.eval_only = False
    cfg = base.cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(extra)
    cfg.freeze()
    check_config_values(cfg)  # values valid one by one may still clash: this trial fails, the study goes on
    return args, cfg, extra


def _failure_line(error: BaseException) -> str:
    """The one-line error of a failed training (a worker's traceback: its last line's message)."""
    if isinstance(error, mp.ProcessRaisedException):
        text = str(error).strip()
        user_error = user_error_of_traceback(text)
        if user_error is not None:
            return user_error[1]
        logger.error("A training worker failed:\n%s", text)
        return text.splitlines()[-1] if text else "a worker process failed"
    if isinstance(error, ReidUserError):
        return str(error)
    logger.exception("Training failed with an unexpected error")
    return f"{type(error).__name__}: {error}"


def _back_to_study_log(base: TrialBase, output_dir: str) -> None:
    """Point this process's log back at the study's (a trial trained here moved it to the trial's
    folder) and close the trial's log file, so that no file stays open per trial."""
    setup_run_logging(base.log_file)
    close_log_file(output_dir)


def run_trial(trial, space: SearchSpace, base: TrialBase, study_dir: str) -> TrialOutcome:
    """Train one trial: the base command with the trial's values, in the trial's folder.

    Args:
        trial: the claimed ``optuna.trial.Trial`` (a continuation has user attrs ``output_dir``
            and ``resumes_trial``: it resumes from that folder's last checkpoint).
        space: the search space (its params and objective).
        base: the base command (see :class:`TrialBase`).
        study_dir: the study folder (trials go to ``<study_dir>/trials/trial_<number>``).
    Returns:
        COMPLETE with the objective metric of the last evaluation, PRUNED, or FAIL with a one-line error.
    Raises:
        TrainingPreempted: a stop signal; the checkpoint is saved and the study continues the trial.
    """
    optuna = require_optuna()
    state = optuna.trial.TrialState
    attrs = trial.user_attrs
    resumes = attrs.get("resumes_trial")
    output_dir = attrs.get("output_dir") or trial_output_dir(study_dir, trial.number)
    seed = attrs.get("seed")
    if seed is None:  # trials differ only by their values: the base seed, or one per trial
        seed = int(base.cfg.SEED) if base.cfg.SEED >= 0 else _derived_seed(trial.number)
    trial.set_user_attr("output_dir", output_dir)
    trial.set_user_attr("seed", int(seed))
    params = suggest_overrides(trial, space)
    os.makedirs(output_dir, exist_ok=True)
    record = os.path.join(output_dir, TRIAL_RECORD)
    # A new record per attempt (a continuation replaces the interrupted attempt's).
    atomic_write_text(record, json.dumps({"study": trial.study.study_name, "trial": trial.number,
                                          "resumes_trial": resumes, "params": params, "seed": int(seed),
                                          "output_dir": output_dir, "status": "running"}, indent=2) + "\n")
    continues = f" (continues #{resumes}, resuming from its last checkpoint)" if resumes is not None else ""
    logger.info("Trial #%d%s trains in %s", trial.number, continues, output_dir)

    def failed(error: str) -> TrialOutcome:
        update_record(record, status="failed", error=error)
        return TrialOutcome(state.FAIL, error=error)

    try:
        args, cfg, _ = _trial_config(base, params, output_dir, seed, resume=resumes is not None)
    except ReidUserError as e:
        return failed(str(e))
    # As work_on_study reads it; an in-memory storage (tests) has no heartbeat.
    heartbeat_s = float(getattr(trial.study._storage, "get_heartbeat_interval", lambda: None)() or 60)
    resume_with = (f"the same reid-tune command (run again, or by another worker of the study, it continues "
                   f"trial #{trial.number} from this checkpoint)")
    ref = TrialRef(storage_url(trial.study), heartbeat_s, trial.study.study_name, trial._trial_id, trial.number,
                   trial.study.pruner, space.objective.metric, record, resume_with)
    _LIVE_TRIALS[trial._trial_id] = trial
    try:
        launch(_trial_worker, base.args.num_gpus, args=(base.train_worker, args, cfg, ref), **base.launch_options)
    except Exception as e:  # a failed training (a worker's: ProcessRaisedException): this trial fails
        return failed(_failure_line(e))
    finally:
        _LIVE_TRIALS.pop(trial._trial_id, None)
        if base.log_file is not None:
            _back_to_study_log(base, output_dir)
    ended = read_record(record)
    status = ended.get("status")
    if "iterations" in ended:
        trial.set_user_attr("iterations", int(ended["iterations"]))
    if status == "complete":
        return TrialOutcome(state.COMPLETE, value=ended.get("value"))
    if status == "pruned":
        return TrialOutcome(state.PRUNED)
    if status == "preempted":
        checkpoint = ended.get("checkpoint") or "none new (it continues from the last one)"
        raise TrainingPreempted(f"trial #{trial.number} stopped by {ended.get('signal') or 'a signal'} after "
                                f"{ended.get('iterations', '?')} iterations (checkpoint: {checkpoint}): run the same "
                                f"reid-tune command again (or let another worker of the study) to continue trial "
                                f"#{trial.number} from its checkpoint", iteration=int(ended.get("iterations", 0)) - 1,
                                checkpoint=ended.get("checkpoint", ""))
    return failed(f"the training of trial #{trial.number} ended without recording how (status {status!r} in "
                  f"{record})")
