"""The study of a search: its storage, its N trial slots, and the workers that share it.

A study lives in an Optuna RDB storage (SQLite by default, PostgreSQL or MySQL for workers
on several machines). Every worker of a search runs :func:`work_on_study`; together they run
exactly ``n_trials`` trials, however many workers there are and whatever happens to them:

- **Slots.** The process that creates the study enqueues all N trials at once (WAITING):
  the base config's own params first, then N-1 empty slots whose params are sampled when
  the trial suggests them. Workers only ever claim WAITING trials (:func:`claim_next_trial`),
  never create one, so the count cannot overshoot. The study's user attrs ``n_trials``,
  ``objective`` and ``params``, written last, mark the study ready; a worker that loads an
  existing study waits for them and checks that its own search matches.
- **Heartbeats.** A running trial's worker records a heartbeat every ``heartbeat_s``
  seconds (:class:`Heartbeat`). A trial whose heartbeat is older than the grace period
  (3 x ``heartbeat_s``: the worker got kill -9, or its machine died) is failed by the next
  worker that looks, and continued (:func:`continue_interrupted`).
- **Continuations.** An interrupted trial (stale heartbeat, or SIGTERM / SIGINT: the training
  saved a checkpoint) ends FAIL and is continued by a new WAITING trial with the same params,
  its user attrs (``output_dir``: the run resumes from that folder's last checkpoint) and
  ``resumes_trial`` = the interrupted attempt's number. Continuations are claimed first.
- **Sampling.** TPE, reseeded per trial from ``sampler_seed`` and the trial's number
  (:func:`trial_seed`): the same seed and the same history give the same params, whichever
  worker runs the trial.

A study's trials are "finished" when COMPLETE, PRUNED or FAIL and not continued by another
attempt: exactly ``n_trials`` of them when the study is done.

Optuna, SQLAlchemy and the database drivers are optional: they are imported on first use,
and a missing one is one error line naming the pip command.
"""
import contextlib
import dataclasses
import logging
import math
import os
import random
import statistics
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set

from ..utils.errors import MissingPackageError, ReidUserError, UsageError
from ..utils.urls import mask_password, sqlite_file

if TYPE_CHECKING:  # only for the annotations: Optuna is imported on first use
    import optuna

__all__ = [
    "GRACE_PERIOD_FACTOR",
    "Heartbeat",
    "PRUNERS",
    "TrialOutcome",
    "build_pruner",
    "claim_next_trial",
    "continue_interrupted",
    "default_storage_url",
    "continued_attempts",
    "finished_trials",
    "format_params",
    "open_storage",
    "open_study",
    "require_optuna",
    "storage_url",
    "study_progress",
    "trial_seed",
    "work_on_study",
]

logger = logging.getLogger(__name__)

#: the pip command of the optional packages reid-tune needs
TUNE_EXTRA = "pip install 'reid_engine[tune]'"
#: a running trial whose heartbeat is older than this many heartbeat intervals is failed and continued
GRACE_PERIOD_FACTOR = 3
#: the pruners of --pruner
PRUNERS = ("median", "hyperband", "none")
#: seconds a SQLite connection waits for another process's write lock before it gives up
SQLITE_BUSY_TIMEOUT_S = 120.0
#: seconds a worker that loads a study waits for its creator to finish enqueueing the slots
READY_TIMEOUT_S = 60.0
#: tries to open a storage: workers starting together race to create its tables
OPEN_STORAGE_TRIES = 4

#: study user attrs written by the creator; the last three, written last, mark the study ready
_ATTR_SAMPLER_SEED = "sampler_seed"
_ATTR_N_TRIALS, _ATTR_OBJECTIVE, _ATTR_PARAMS = "n_trials", "objective", "params"
#: trial user attrs
_RESUMES, _STATUS, _ERROR, _SLOT, _BASE = "resumes_trial", "status", "error", "slot", "base"
_MAX_ERROR_CHARS = 500


def require_optuna():
    """Import Optuna, or fail with the one-line install hint of reid-tune.

    Returns:
        the ``optuna`` module.
    Raises:
        MissingPackageError: Optuna (or SQLAlchemy, which it needs for a database) is not installed.
    """
    try:
        import optuna
        import sqlalchemy  # noqa: F401  (the RDB storage needs it; Optuna itself does not)
    except ImportError:
        raise MissingPackageError(f"reid-tune needs Optuna: {TUNE_EXTRA}") from None
    return optuna


# ----------------------------------------------------------------------------------------------
# storage


def default_storage_url(study_dir: str) -> str:
    """The SQLite storage of a search whose files go to `study_dir`: ``sqlite:///<abs study_dir>/study.db``."""
    return "sqlite:///" + os.path.join(os.path.abspath(study_dir), "study.db")


def storage_url(study: "optuna.Study") -> str:
    """The database URL of `study`'s storage ("" when it has none, e.g. in memory)."""
    storage = study._storage  # Optuna wraps an RDBStorage in a cache; no public API names the URL
    return str(getattr(getattr(storage, "_backend", storage), "url", "") or "")


def open_storage(url: str, heartbeat_s: float = 60.0) -> "optuna.storages.RDBStorage":
    """Open (and create the tables of) the study storage at database URL `url`.

    Workers record a heartbeat every ``heartbeat_s`` seconds (Optuna takes whole seconds: at
    least 1); a running trial whose last heartbeat is older than the grace period,
    ``GRACE_PERIOD_FACTOR`` x that, is failed by the next worker that looks and continued by
    :func:`continue_interrupted`. SQLite gets a busy timeout of ``SQLITE_BUSY_TIMEOUT_S``
    (several processes share the file) and its folder is created.

    Args:
        url: a SQLAlchemy database URL, e.g. ``sqlite:////abs/study.db`` or
            ``postgresql+psycopg://user:password@host:5432/db``.
        heartbeat_s: the heartbeat interval, seconds.
    Returns:
        the storage (pass it to :func:`open_study`).
    Raises:
        MissingPackageError: Optuna, SQLAlchemy or the database's driver is not installed.
        ReidUserError: the URL is no database URL, or the database cannot be reached (one line,
            password masked).
    """
    optuna = require_optuna()
    import sqlalchemy.exc

    shown = mask_password(url)
    interval = max(1, int(round(heartbeat_s)))
    engine_kwargs: Dict[str, Any] = {}
    database_file = sqlite_file(url)
    if database_file is not None:
        os.makedirs(os.path.dirname(database_file), exist_ok=True)
        engine_kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    kwargs: Dict[str, Any] = dict(engine_kwargs=engine_kwargs, heartbeat_interval=interval,
                                  grace_period=GRACE_PERIOD_FACTOR * interval)
    # Optuna 4.9 renamed the callback argument; older versions know only failed_trial_callback.
    callback_arg = "heartbeat_stale_trial_callback"
    if not _accepts_argument(optuna.storages.RDBStorage, callback_arg):
        callback_arg = "failed_trial_callback"
    kwargs[callback_arg] = continue_interrupted
    for attempt in range(OPEN_STORAGE_TRIES):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval
                return optuna.storages.RDBStorage(url, **kwargs)
        except sqlalchemy.exc.NoSuchModuleError:
            raise UsageError(f"unknown kind of database in the study storage URL {shown} (--storage): use "
                             "sqlite:////path/study.db, postgresql+psycopg://user@host/db or mysql+pymysql://...") from None
        except sqlalchemy.exc.ArgumentError as e:
            raise UsageError(f"cannot read the study storage URL {shown} (--storage): {_first_line(e)}; use "
                             "e.g. sqlite:////path/study.db or postgresql+psycopg://user@host/db") from None
        except ImportError as e:
            raise MissingPackageError(f"the study storage {shown} needs its database driver, which is not installed "
                                      f"({_first_line(e.__cause__ or e)}): {_driver_hint(url)}") from None
        except RuntimeError as e:  # Optuna's check of the tables' schema version
            raise ReidUserError(f"cannot use the study storage {shown} (--storage): {_first_line(e)}") from None
        except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            # Workers started together race to create the tables: a second try finds them made.
            if attempt + 1 < OPEN_STORAGE_TRIES and not isinstance(e, sqlalchemy.exc.InterfaceError):
                time.sleep(0.3 * (attempt + 1) + random.random() * 0.3)
                continue
            raise ReidUserError(f"cannot open the study storage {shown} (--storage): {_first_line(e)}; "
                                "check that the database server runs and that the URL's user, host, port "
                                "and database are right") from None
    raise AssertionError("unreachable")


def _accepts_argument(cls: type, name: str) -> bool:
    import inspect

    return name in inspect.signature(cls.__init__).parameters


def _first_line(error: BaseException) -> str:
    """The first line of `error`'s message, without a password it may quote."""
    text = str(getattr(error, "orig", None) or error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return mask_password(line)[:300]


def _driver_hint(url: str) -> str:
    scheme = url.split(":", 1)[0].lower()
    if scheme.startswith("postgresql"):
        return "pip install 'psycopg[binary]' and use postgresql+psycopg://"
    if scheme.startswith("mysql"):
        return "pip install pymysql and use mysql+pymysql://"
    return f"install the Python driver of {scheme}"


_held = threading.local()  # whether this thread holds the state lock (a nested use must not wait for itself)


@contextlib.contextmanager
def _state_lock(study: "optuna.Study") -> Iterator[None]:
    """Make a change of trial state atomic among the workers of a SQLite study.

    Optuna changes a state by reading the trial's row (SELECT ... FOR UPDATE) and then
    writing it; PostgreSQL and MySQL lock the row, but SQLite ignores FOR UPDATE and Python's
    sqlite3 starts the transaction only at the write, so two workers could both see a trial
    WAITING and both claim it. On SQLite every state change of these workers (claim, tell,
    failing a stale trial) therefore holds an exclusive lock on ``<db file>.lock`` (one machine:
    SQLite's own locking needs a local disk too). Elsewhere this does nothing.
    """
    database_file = sqlite_file(storage_url(study))
    try:
        import fcntl
    except ImportError:  # Windows: no flock; a parallel search there should use a database server
        fcntl = None
    if database_file is None or fcntl is None or getattr(_held, "depth", 0):  # held already: flock is per file handle
        yield
        return
    with open(database_file + ".lock", "a") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------
# study


def build_pruner(name: str) -> "optuna.pruners.BasePruner":
    """The pruner of --pruner `name`: ``median`` (prune a trial whose evaluation is below the
    median of earlier trials' at the same iteration, from the third trial on; checked at every
    evaluation), ``hyperband`` (Optuna's defaults; a resource unit is one iteration) or ``none``.

    Raises:
        UsageError: an unknown name (one line).
    """
    optuna = require_optuna()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0, interval_steps=1)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    if name == "none":
        return optuna.pruners.NopPruner()
    raise UsageError(f"unknown pruner {name!r} (--pruner): use one of {', '.join(PRUNERS)}")


def open_study(storage, study_name: str, space, n_trials: int, sampler_seed: int,
               base_params: Mapping[str, Any], pruner: str) -> "optuna.Study":
    """Create the study `study_name` with its `n_trials` slots, or load it when it exists.

    The creator enqueues the slots (the first with `base_params`, the base config's own
    values, user attr ``base``), then writes the study's user attrs ``sampler_seed``,
    ``n_trials``, ``objective`` and ``params``, the last three as the mark that the study is
    ready. A loading worker waits up to ``READY_TIMEOUT_S`` for that mark and checks that its
    search is the study's. The study's own ``sampler_seed`` is used by every worker.

    Args:
        storage: from :func:`open_storage`.
        study_name: the study's name in the storage.
        space: the search space (``SearchSpace``: its param keys and objective).
        n_trials: the number of trials the search runs in all.
        sampler_seed: the TPE sampler's seed (trial k is sampled with ``trial_seed(seed, k)``).
        base_params: config key -> the base config's value, for the first slot.
        pruner: a name of :data:`PRUNERS`.
    Returns:
        the study.
    Raises:
        UsageError: n_trials < 1, an unknown pruner, or the existing study has another
            trial count, objective or param keys (one line).
        ReidUserError: the study exists but never became ready.
    """
    optuna = require_optuna()
    if n_trials < 1:
        raise UsageError(f"--n-trials is {n_trials}: a search needs at least 1 trial")
    direction = space.objective.direction
    sampler = optuna.samplers.TPESampler(seed=sampler_seed)
    try:
        study = optuna.create_study(storage=storage, study_name=study_name, direction=direction,
                                    sampler=sampler, pruner=build_pruner(pruner), load_if_exists=False)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler, pruner=build_pruner(pruner))
        _wait_until_ready(study)
        _check_same_search(study, space, n_trials)
        stored_seed = study.user_attrs.get(_ATTR_SAMPLER_SEED)
        if stored_seed is not None and stored_seed != sampler_seed:
            logger.info("Study %s samples with its own seed %s (this command's --sampler-seed %s is not used)",
                        study_name, stored_seed, sampler_seed)
        logger.info("Joined study %s: %s", study_name, study_progress(study))
        return study
    study.enqueue_trial(dict(base_params), user_attrs={_BASE: True, _SLOT: 1})
    for slot in range(2, n_trials + 1):
        study.enqueue_trial({}, user_attrs={_SLOT: slot})
    study.set_user_attr(_ATTR_SAMPLER_SEED, int(sampler_seed))
    study.set_user_attr(_ATTR_OBJECTIVE, {"metric": space.objective.metric, "direction": direction})
    study.set_user_attr(_ATTR_PARAMS, _space_keys(space))
    study.set_user_attr(_ATTR_N_TRIALS, int(n_trials))  # last: the study is ready
    logger.info("Created study %s: %d trials over %s, %s %s", study_name, n_trials, ", ".join(_space_keys(space)),
                direction, space.objective.metric)
    return study


def _space_keys(space) -> List[str]:
    return [p.key for p in space.params]


def _wait_until_ready(study: "optuna.Study") -> None:
    """Wait until the study's creator has enqueued every slot (it writes ``n_trials`` last)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while _ATTR_N_TRIALS not in study.user_attrs:
        if time.monotonic() > deadline:
            raise ReidUserError(f"study {study.study_name} exists but its creator never finished setting it up "
                                f"(no trial count after {READY_TIMEOUT_S:g} s; it may have been stopped): "
                                "use another --study-name, or delete the study from the storage")
        time.sleep(0.2)


def _check_same_search(study: "optuna.Study", space, n_trials: int) -> None:
    """One line when this command's search is not the study's: trial count, objective or keys."""
    attrs = study.user_attrs
    theirs = (attrs[_ATTR_N_TRIALS], sorted(attrs.get(_ATTR_PARAMS, [])), dict(attrs.get(_ATTR_OBJECTIVE, {})))
    mine = (n_trials, sorted(_space_keys(space)), {"metric": space.objective.metric,
                                                   "direction": space.objective.direction})
    if theirs != mine:
        def describe(count, keys, objective):
            return (f"{count} trials over keys {', '.join(keys)} ({objective.get('direction', '?')} "
                    f"{objective.get('metric', '?')})")

        raise UsageError(f"study {study.study_name} has {describe(*theirs)}, this command asks for {describe(*mine)}: "
                         "use the same search space and --n-trials, or another --study-name")


# ----------------------------------------------------------------------------------------------
# trials


def _slot(frozen) -> str:
    slot = frozen.user_attrs.get(_SLOT)
    return str(slot) if slot is not None else "?"


def claim_next_trial(study: "optuna.Study") -> "Optional[optuna.trial.Trial]":
    """Claim the next WAITING trial of the study for this worker (state RUNNING).

    Continuations come first, then the slots in order. A trial is claimed by setting its
    state from WAITING to RUNNING, which only one worker can do (the storage locks the row;
    SQLite: see :func:`_state_lock`). No trial is ever created, which keeps the count exact.
    The sampler is reseeded from the study's seed and the trial's number (:func:`trial_seed`)
    before the trial is built, so its params do not depend on which worker claimed it. A
    heartbeat is recorded just before the claim so that a worker killed right after it still
    leaves a trial that goes stale.

    Returns:
        the claimed trial, or None when no WAITING trial is left (or all were taken meanwhile).
    """
    optuna = require_optuna()
    storage = study._storage  # no public API claims a given WAITING trial (ask() would create one)
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    waiting = sorted(waiting, key=lambda t: (_RESUMES not in t.user_attrs, t.number))
    heartbeat_on = getattr(storage, "get_heartbeat_interval", lambda: None)() is not None
    for frozen in waiting:
        try:
            with _state_lock(study):
                if heartbeat_on:
                    storage.record_heartbeat(frozen._trial_id)
                claimed = storage.set_trial_state_values(frozen._trial_id, state=optuna.trial.TrialState.RUNNING)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # finished by another worker meanwhile
        except optuna.exceptions.StorageInternalError as e:  # e.g. a database lock timed out: try the next
            logger.warning("Could not claim trial #%d (%s); trying the next one", frozen.number, _first_line(e))
            continue
        if not claimed:
            continue  # another worker took it
        study.sampler = optuna.samplers.TPESampler(seed=trial_seed(study.user_attrs.get(_ATTR_SAMPLER_SEED, 0),
                                                                  frozen.number))
        return optuna.trial.Trial(study, frozen._trial_id)  # runs the sampler's before_trial, as ask() does
    return None


def trial_seed(sampler_seed: int, trial_number: int) -> int:
    """The sampler's seed for trial `trial_number` of a study seeded with `sampler_seed`.

    Derived from both numbers (NumPy's SeedSequence), so that studies of nearby seeds do not
    repeat each other's draws shifted by one trial, as ``sampler_seed + trial_number`` would.
    """
    import numpy as np

    return int(np.random.SeedSequence([int(sampler_seed), int(trial_number)]).generate_state(1)[0])


def continue_interrupted(study: "optuna.Study", trial: "optuna.trial.FrozenTrial") -> None:
    """Add a WAITING trial that continues the interrupted attempt `trial` (now FAIL).

    The continuation has the attempt's params and distributions, user attrs (its
    ``output_dir``: the run resumes from its last checkpoint) and intermediate values, the
    base slot's fixed params when the attempt had not suggested them yet, and user attr
    ``resumes_trial`` = the attempt's number (the latest attempt, for a continuation of a
    continuation). It is the storage's callback for trials whose heartbeat went stale, and
    is called on SIGTERM / SIGINT too.
    """
    optuna = require_optuna()
    user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in (_STATUS, _ERROR)}
    user_attrs[_RESUMES] = trial.number
    system_attrs = {}
    if "fixed_params" in trial.system_attrs:  # the enqueued params of the base slot
        system_attrs["fixed_params"] = trial.system_attrs["fixed_params"]
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING, params=trial.params, distributions=trial.distributions,
        user_attrs=user_attrs, system_attrs=system_attrs, intermediate_values=trial.intermediate_values))
    logger.warning("Trial #%d (slot %s) was interrupted: a new trial continues it from its last checkpoint",
                   trial.number, _slot(trial))


class Heartbeat:
    """Record a trial's heartbeat now and then every `interval_s` seconds, from a daemon thread.

    A context manager around a running trial: the thread stops when the block ends. Without
    heartbeats a trial would never be seen as stale, so the first one is recorded before the
    block starts. A failed recording (a database hiccup) is logged and retried next time.
    """

    def __init__(self, storage, trial_id: int, interval_s: float):
        self.storage, self.trial_id, self.interval_s = storage, trial_id, max(0.05, float(interval_s))
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _beat(self) -> None:
        try:
            self.storage.record_heartbeat(self.trial_id)
        except Exception as e:  # keep beating: one missed heartbeat is far from the grace period
            logger.warning("Could not record the heartbeat of trial id %d: %s", self.trial_id, _first_line(e))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._beat()

    def __enter__(self) -> "Heartbeat":
        self._beat()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.trial_id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.interval_s))
            self._thread = None


@dataclasses.dataclass
class TrialOutcome:
    """How a trial run ended: COMPLETE with the objective `value`, PRUNED, or FAIL with a one-line `error`."""

    state: "optuna.trial.TrialState"
    value: Optional[float] = None
    error: str = ""


def continued_attempts(trials: Sequence["optuna.trial.FrozenTrial"]) -> Set[int]:
    """The numbers of the interrupted attempts that a later trial continues (user attr ``resumes_trial``)."""
    return {int(t.user_attrs[_RESUMES]) for t in trials if t.user_attrs.get(_RESUMES) is not None}


def finished_trials(trials: Sequence["optuna.trial.FrozenTrial"]) -> List["optuna.trial.FrozenTrial"]:
    """The trials that count towards the study's N: COMPLETE, PRUNED or FAIL, and not continued by another."""
    continued = continued_attempts(trials)
    return [t for t in trials if t.state.is_finished() and t.number not in continued]


def _best(study: "optuna.Study", trials) -> "Optional[optuna.trial.FrozenTrial]":
    optuna = require_optuna()
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    if not complete:
        return None
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return (max if maximize else min)(complete, key=lambda t: t.value)


def study_progress(study: "optuna.Study") -> str:
    """One line: ``5 of 12 trials finished (3 complete, 2 pruned), 2 running, best #4 0.6123``."""
    optuna = require_optuna()
    state = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    finished = finished_trials(trials)
    total = study.user_attrs.get(_ATTR_N_TRIALS, len(trials))
    counts = [(sum(t.state == s for t in finished), name) for s, name in
              ((state.COMPLETE, "complete"), (state.PRUNED, "pruned"), (state.FAIL, "failed"))]
    counted = ", ".join(f"{n} {name}" for n, name in counts if n or name == "complete")
    running = sum(t.state == state.RUNNING for t in trials)
    line = f"{len(finished)} of {total} trials finished ({counted}), {running} running"
    best = _best(study, trials)
    if best is not None:
        line += f", best #{best.number} {best.value:.4f}"
    return line


def _eta(study: "optuna.Study") -> str:
    """`` ETA 0:03:20``: the finished trials' median duration x the trials left / the workers running them."""
    optuna = require_optuna()
    trials = study.get_trials(deepcopy=False)
    finished = finished_trials(trials)
    durations = [(t.datetime_complete - t.datetime_start).total_seconds() for t in finished
                 if t.state != optuna.trial.TrialState.FAIL and t.datetime_start and t.datetime_complete]
    left = int(study.user_attrs.get(_ATTR_N_TRIALS, len(trials))) - len(finished)
    if not durations or left <= 0:
        return ""
    workers = 1 + sum(t.state == optuna.trial.TrialState.RUNNING for t in trials)  # this worker is between trials
    seconds = int(statistics.median(durations) * left / workers)
    return f", ETA {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_params(params: Mapping[str, Any], keys: Optional[Sequence[str]] = None) -> str:
    """``KEY=value`` pairs on one line, for logs and headers (floats with 4 significant digits)."""
    names = list(keys) if keys is not None else list(params)
    return " ".join(f"{k}={_short(params[k])}" for k in names if k in params)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _describe_params(trial) -> str:
    params = dict(trial.params) or dict(getattr(trial, "system_attrs", {}).get("fixed_params", {}))
    return format_params(params) if params else "params sampled when the run starts"


def _one_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line[:_MAX_ERROR_CHARS]


def _finish(study: "optuna.Study", trial: "optuna.trial.Trial", state, value: Optional[float] = None,
            attrs: Optional[Dict[str, Any]] = None) -> "Optional[optuna.trial.FrozenTrial]":
    """Tell the study how `trial` ended, with user `attrs`; None when it was already finished
    (another worker found its heartbeat stale and continued it)."""
    optuna = require_optuna()
    with _state_lock(study):
        if study._storage.get_trial(trial._trial_id).state.is_finished():
            return None
        for key, attr in (attrs or {}).items():
            trial.set_user_attr(key, attr)
        values = value if state == optuna.trial.TrialState.COMPLETE else None
        return study.tell(trial, values, state=state)


def _outcome_of(outcome: TrialOutcome) -> TrialOutcome:
    """A COMPLETE outcome without a finite value becomes a FAIL (Optuna refuses it)."""
    optuna = require_optuna()
    if outcome.state == optuna.trial.TrialState.COMPLETE:
        if outcome.value is None or not math.isfinite(float(outcome.value)):
            return TrialOutcome(optuna.trial.TrialState.FAIL, error=f"the objective value is {outcome.value}")
    return outcome


def work_on_study(study: "optuna.Study", run_trial: Callable[["optuna.trial.Trial"], TrialOutcome],
                  poll_s: float = 5.0, log: logging.Logger = logger) -> None:
    """Run the study's trials, one at a time, until every one has finished (in any worker).

    Each round fails the stale running trials (their continuations join the queue), claims
    the next WAITING trial and runs it with `run_trial` under a :class:`Heartbeat`, then tells
    the study its outcome (user attr ``status``: complete / pruned / failed, and ``error``).
    A failed trial does not stop the search. When no trial is waiting but some run elsewhere
    (or have gone stale but are still within their grace period), the worker polls every
    `poll_s` seconds; it returns when no trial is waiting or running.

    `run_trial` raising ``TrainingPreempted`` (SIGTERM / SIGINT: the training saved its
    checkpoint), KeyboardInterrupt or SystemExit: the trial ends FAIL with status
    ``preempted``, a continuation is queued, and the exception goes on (the command exits
    143). Any other exception: the trial ends FAIL with the error, then it goes on (a bug
    must not be hidden, and the trial must not stay RUNNING).
    """
    optuna = require_optuna()
    state = optuna.trial.TrialState
    storage = study._storage
    interval = float(storage.get_heartbeat_interval() or 60)
    total = study.user_attrs.get(_ATTR_N_TRIALS, "?")
    while True:
        with _state_lock(study), warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        trial = claim_next_trial(study)
        if trial is None:
            trials = study.get_trials(deepcopy=False, states=(state.WAITING, state.RUNNING))
            if not trials:
                log.info("Study %s is done: %s", study.study_name, study_progress(study))
                return
            time.sleep(poll_s)
            continue
        frozen = study._storage.get_trial(trial._trial_id)
        resumed = f", continuing #{frozen.user_attrs[_RESUMES]}" if _RESUMES in frozen.user_attrs else ""
        log.info("Trial #%d (slot %s of %s%s) started: %s", trial.number, _slot(frozen), total, resumed,
                 _describe_params(frozen))
        try:
            with Heartbeat(storage, trial._trial_id, interval):
                outcome = _outcome_of(run_trial(trial))
        except BaseException as e:
            _end_interrupted_or_broken(study, trial, e, log)
            raise
        status = {state.COMPLETE: "complete", state.PRUNED: "pruned"}.get(outcome.state, "failed")
        attrs: Dict[str, Any] = {_STATUS: status}
        if status == "failed":
            attrs[_ERROR] = _one_line(outcome.error or "failed")
        told = _finish(study, trial, outcome.state if status != "failed" else state.FAIL, outcome.value, attrs)
        if told is None:
            log.warning("Trial #%d had already been ended by another worker (its heartbeat went stale) and is "
                        "continued there: this run's result is dropped", trial.number)
            continue
        ended = {"complete": f"complete: {outcome.value:.4f}" if outcome.value is not None else "complete",
                 "pruned": "pruned", "failed": f"failed: {attrs.get(_ERROR, '')}"}[status]
        log.info("Trial #%d %s (%s). %s%s", trial.number, ended, _describe_params(told), study_progress(study),
                 _eta(study))


def _end_interrupted_or_broken(study: "optuna.Study", trial: "optuna.trial.Trial", error: BaseException,
                               log: logging.Logger) -> None:
    """End `trial` FAIL after `run_trial` raised `error`: a stop request (queue a continuation) or a bug."""
    optuna = require_optuna()
    from ..reliability.preemption import TrainingPreempted  # here: only an exception needs the engine

    interrupted = isinstance(error, (TrainingPreempted, KeyboardInterrupt, SystemExit))
    attrs = {_STATUS: "preempted"} if interrupted else {_STATUS: "failed", _ERROR: _one_line(f"{type(error).__name__}: {error}")}
    try:
        told = _finish(study, trial, optuna.trial.TrialState.FAIL, attrs=attrs)
        if told is not None and interrupted:
            continue_interrupted(study, told)
    except Exception as e:  # the original error matters more; say why the study could not record it
        log.error("Could not record the end of trial #%d in the study: %s", trial.number, _first_line(e))
        return
    if not interrupted:
        log.error("Trial #%d failed with an unexpected error (%s); the search stops", trial.number, attrs[_ERROR])
