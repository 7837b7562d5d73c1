"""The study of a search and the loop of its workers, on Optuna's public API: an RDB storage with
heartbeats and ``RetryHeartbeatStaleTrialCallback``, ``study.optimize`` one trial at a time. What
Optuna lacks (SQLite's row locks, the trial count) is a small layer here; docs/tuning.md, "What
reid-tune adds to Optuna", says what and why."""
import logging
import os
import random
import statistics
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Sequence

from ..utils.errors import MissingPackageError, ReidUserError, UsageError, first_line
from ..utils.urls import mask_password, sqlite_file

if TYPE_CHECKING:  # Optuna is imported on first use
    import optuna

__all__ = ["PRUNERS", "TrialFailed", "require_optuna", "default_storage_url", "open_storage", "build_pruner",
           "open_study", "retry_of", "retried_from", "finished_trials", "trial_seed", "study_progress",
           "format_params", "work_on_study"]

logger = logging.getLogger(__name__)

TUNE_EXTRA = "pip install 'reid_engine[tune]'"
GRACE_PERIOD_FACTOR = 3
PRUNERS = ("median", "hyperband", "none")
SQLITE_BUSY_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 60.0
OPEN_STORAGE_TRIES = 4  # workers starting together race to create the tables
_ATTR_SEED, _ATTR_N_TRIALS, _ATTR_OBJECTIVE, _ATTR_PARAMS = "sampler_seed", "n_trials", "objective", "params"


class TrialFailed(ReidUserError):
    """A trial's training failed (its one-line error): the trial ends FAIL and the study goes on."""


def require_optuna():
    """The ``optuna`` module, or one :class:`MissingPackageError` line naming the pip command."""
    try:
        import optuna
        import sqlalchemy  # noqa: F401  (the RDB storage needs it)
    except ImportError:
        raise MissingPackageError(f"reid-tune needs Optuna: {TUNE_EXTRA}") from None
    # Heartbeats, their retry callback and fANOVA are experimental in Optuna: used on purpose.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def default_storage_url(study_dir: str) -> str:
    """The SQLite storage of the study folder `study_dir`: ``sqlite:///<abs study_dir>/study.db``."""
    return "sqlite:///" + os.path.join(os.path.abspath(study_dir), "study.db")


def _shown(url: str) -> str:
    """`url` with its password masked, also without a scheme (``user:password@host/db``)."""
    return mask_password(url) if "://" in url else mask_password("//" + url)[2:]


def open_storage(url: str, heartbeat_s: float = 60.0) -> "optuna.storages.RDBStorage":
    """The study storage at `url` (its tables created), with heartbeats every `heartbeat_s` seconds (whole,
    at least 1) and the retry of stale trials; a problem is one line naming the URL (password masked)."""
    optuna = require_optuna()
    import sqlalchemy.engine
    import sqlalchemy.exc

    shown = _shown(url)
    try:  # read before anything is created: a bad port or scheme, a missing driver (ImportError)
        sqlalchemy.engine.make_url(url).get_dialect().import_dbapi()
    except sqlalchemy.exc.NoSuchModuleError:
        raise UsageError(f"unknown kind of database in the study storage URL {shown} (--storage): use sqlite:////path/study.db, "
                         "postgresql+psycopg://user@host/db or mysql+pymysql://...") from None
    except (sqlalchemy.exc.ArgumentError, ValueError) as e:
        raise UsageError(f"cannot read the study storage URL {shown} (--storage): {mask_password(first_line(e))}; "
                         "use e.g. sqlite:////path/study.db or postgresql+psycopg://user@host:5432/db") from None
    except ImportError as e:
        raise MissingPackageError(f"the study storage {shown} needs its database driver ({first_line(e)}): {TUNE_EXTRA} "
                                  "(PostgreSQL) or pip install pymysql") from None
    interval, db = max(1, int(round(heartbeat_s))), sqlite_file(url)
    if db is not None:
        os.makedirs(os.path.dirname(db), exist_ok=True)
    for attempt in range(OPEN_STORAGE_TRIES):
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs={"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if db else {},
                heartbeat_interval=interval, grace_period=GRACE_PERIOD_FACTOR * interval,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    inherit_intermediate_values=True))
        except RuntimeError as e:  # Optuna's check of the tables' schema version
            raise ReidUserError(f"cannot use the study storage {shown} (--storage): {first_line(e)}") from None
        except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            if attempt + 1 == OPEN_STORAGE_TRIES or isinstance(e, sqlalchemy.exc.InterfaceError):
                reason = mask_password(first_line(getattr(e, "orig", None) or e))
                raise ReidUserError(f"cannot open the study storage {shown} (--storage): {reason}; check that the "
                                    "database server runs and the URL's user, host, port and database") from None
            time.sleep(0.3 * (attempt + 1) + random.random() * 0.3)


def build_pruner(name: str) -> "optuna.pruners.BasePruner":
    """The pruner of --pruner `name`: median (from the third trial, at every evaluation), hyperband, none."""
    optuna = require_optuna()
    pruners = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
               "hyperband": optuna.pruners.HyperbandPruner, "none": optuna.pruners.NopPruner}
    if name not in pruners:
        raise UsageError(f"unknown pruner {name!r} (--pruner): use one of {', '.join(PRUNERS)}")
    return pruners[name]()


def open_study(storage, study_name: str, space, n_trials: int, sampler_seed: int,
               base_params: Mapping[str, Any], pruner: str) -> "optuna.Study":
    """Create the study (its first trial enqueued with `base_params`, the base config's values; its user
    attrs last, ``n_trials`` marking it ready), or load it, wait until ready and check it is the same search."""
    optuna = require_optuna()
    if n_trials < 1:
        raise UsageError(f"--n-trials is {n_trials}: a search needs at least 1 trial")
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # reid-tune logs the study and each trial in its own lines
    mine = {_ATTR_N_TRIALS: int(n_trials), _ATTR_PARAMS: list(space.keys),
            _ATTR_OBJECTIVE: {"metric": space.objective.metric, "direction": space.objective.direction}}
    options = dict(storage=storage, study_name=study_name, pruner=build_pruner(pruner),
                   sampler=optuna.samplers.TPESampler(seed=sampler_seed))
    try:
        study = optuna.create_study(direction=space.objective.direction, **options)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(**options)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while _ATTR_N_TRIALS not in study.user_attrs:
            if time.monotonic() > deadline:
                raise ReidUserError(f"study {study_name} exists but its creator never finished setting it up "
                                    "(it may have been stopped): use another --study-name, or delete the study")
            time.sleep(0.2)
        theirs = {k: study.user_attrs.get(k) for k in mine}
        if theirs != mine:
            raise UsageError(f"study {study_name} has {_describe(theirs)}, this command asks for {_describe(mine)}: "
                             "use the same search space and --n-trials, or another --study-name")
        logger.info("Joined study %s: %s", study_name, study_progress(study))
        return study
    study.enqueue_trial(dict(base_params))
    for key, value in ((_ATTR_SEED, int(sampler_seed)), *mine.items()):  # n_trials last: ready
        study.set_user_attr(key, value)
    logger.info("Created study %s: %d trials over %s, %s %s", study_name, n_trials, ", ".join(space.keys),
                space.objective.direction, space.objective.metric)
    return study


def _describe(attrs: Mapping[str, Any]) -> str:
    objective = attrs.get(_ATTR_OBJECTIVE) or {}
    return (f"{attrs.get(_ATTR_N_TRIALS)} trials over keys {', '.join(attrs.get(_ATTR_PARAMS) or [])} "
            f"({objective.get('direction', '?')} {objective.get('metric', '?')})")


def retry_of(trial: "optuna.trial.FrozenTrial"):
    """(the first attempt `trial` retries, all of them) from Optuna's retry callback; (None, []) for none."""
    retry = require_optuna().storages.RetryHeartbeatStaleTrialCallback
    return retry.retried_trial_number(trial), list(retry.retry_history(trial))


def retried_from(trial: "optuna.trial.FrozenTrial") -> Optional[int]:
    """The attempt `trial` continues (the latest of its retry history), or None for a first attempt."""
    return (retry_of(trial)[1] or [None])[-1]


def finished_trials(trials: Sequence["optuna.trial.FrozenTrial"]) -> List["optuna.trial.FrozenTrial"]:
    """The trials that count towards the study's N: finished, and not continued by another."""
    continued = {number for t in trials for number in retry_of(t)[1]}
    return [t for t in trials if t.state.is_finished() and t.number not in continued]


def trial_seed(sampler_seed: int, trial_number: int) -> int:
    """The TPE seed of trial `trial_number`, from both numbers (NumPy's SeedSequence), so that the
    same seed and history give the same values whichever worker runs the trial."""
    import numpy as np

    return int(np.random.SeedSequence([int(sampler_seed), int(trial_number)]).generate_state(1)[0])


def study_progress(study: "optuna.Study", best: bool = True) -> str:
    """``5 of 12 trials finished (3 complete, 2 pruned, 0 failed, 2 running)[, best #4 0.6123, ETA 0:03:20]``
    (`best`: with the best trial and the ETA); retries waiting to start are named too."""
    trials = study.get_trials(deepcopy=False)
    finished, total = finished_trials(trials), study.user_attrs.get(_ATTR_N_TRIALS)
    states = [t.state.name for t in finished]
    running = sum(t.state.name == "RUNNING" for t in trials)
    waiting = sum(t.state.name == "WAITING" and retried_from(t) is not None for t in trials)
    parts = [f"{states.count(s)} {s.lower().replace('fail', 'failed')}" for s in ("COMPLETE", "PRUNED", "FAIL")]
    parts += [f"{running} running"] * bool(running) + [f"{waiting} interrupted, waiting to be continued"] * bool(waiting)
    line = f"{len(finished)}{f' of {total}' if total else ''} trials finished ({', '.join(parts)})"
    if best and "COMPLETE" in states:
        line += f", best #{study.best_trial.number} {study.best_trial.value:.4f}"
    durations = [t.duration.total_seconds() for t in finished if t.state.name != "FAIL" and t.duration]
    left = (total or 0) - len(finished)
    if best and durations and left > 0:  # the median trial x the trials left / the workers (this one is between trials)
        seconds = int(statistics.median(durations) * left / (1 + running))
        line += f", ETA {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return line


def format_params(params: Mapping[str, Any]) -> str:
    """``KEY=value`` pairs on one line (floats with 4 significant digits)."""
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def work_on_study(study: "optuna.Study", run_trial: Callable[["optuna.trial.Trial"], float], storage, storage_url: str,
                  poll_s: float = 5.0, log: logging.Logger = logger) -> None:
    """Run the study's trials with ``study.optimize``, one at a time, while ``finished + running < N``
    (a retried attempt not counted), then wait for those running elsewhere, one of which may go stale;
    a stop (``TrainingPreempted``, KeyboardInterrupt) queues the trial's retry and goes on up."""
    optuna = require_optuna()
    from filelock import FileLock

    from ..reliability.preemption import TrainingPreempted  # only an exception needs the engine

    state, n_trials, started = optuna.trial.TrialState, int(study.user_attrs[_ATTR_N_TRIALS]), []
    # SQLite has no row locks: one worker at a time from its look at the study to the start of its trial.
    lock = FileLock(sqlite_file(storage_url) + ".lock") if sqlite_file(storage_url) else None
    unlock = lock.release if lock else lambda: None  # a no-op when not held

    def objective(trial: "optuna.trial.Trial") -> float:
        unlock()  # Optuna has popped (or created) this trial: the next worker may look
        started.append(trial.number)
        resumed = retried_from(study.get_trials(deepcopy=False)[trial.number])
        log.info("Trial #%d started%s", trial.number, f", continuing #{resumed}" if resumed is not None else "")
        return run_trial(trial)

    while True:
        if lock:
            lock.acquire()
        try:
            optuna.storages.fail_stale_trials(study)  # their retries join the queue
            trials = study.get_trials(deepcopy=False)
            waiting = [t.number for t in trials if t.state == state.WAITING]
            running = sum(t.state == state.RUNNING for t in trials)
            if not waiting and len(finished_trials(trials)) + running >= n_trials:
                if not running:
                    log.info("Study %s is done: %s", study.study_name, study_progress(study))
                    return
                unlock()
                time.sleep(poll_s)  # the last trials run elsewhere; one may go stale
                continue
            study.sampler = optuna.samplers.TPESampler(seed=trial_seed(study.user_attrs.get(_ATTR_SEED, 0),
                                                                      min(waiting, default=len(trials))))
            study.optimize(objective, n_trials=1, catch=(TrialFailed,))
        except (TrainingPreempted, KeyboardInterrupt):
            interrupted = study.get_trials(deepcopy=True)[started[-1]] if started else None
            if interrupted is not None and interrupted.state == state.FAIL:  # the storage's retry, as for a stale one
                storage.get_heartbeat_stale_trial_callback()(study, interrupted)
                log.warning("Trial #%d was interrupted: a new trial continues it from its checkpoint", started[-1])
            raise
        except optuna.exceptions.UpdateFinishedTrialError:
            log.warning("Trial #%d had already been ended by another worker (its heartbeat went stale) and is "
                        "continued there: this run's result is dropped", started[-1])
            continue
        finally:
            unlock()
        frozen = study.get_trials(deepcopy=False)[started[-1]]
        ended = (f"complete: {frozen.value:.4f}" if frozen.state == state.COMPLETE else "pruned"
                 if frozen.state == state.PRUNED else f"failed: {frozen.user_attrs.get('error', '')}")
        log.info("Trial #%d %s (%s). %s", frozen.number, ended, format_params(frozen.params), study_progress(study))
