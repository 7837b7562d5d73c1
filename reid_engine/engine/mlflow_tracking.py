"""MLFLOW.*: track training runs in MLflow (optional: ``pip install 'reid_engine[mlflow]'``).

:class:`MLflowWriter` is one more event writer of the trainer (main process only). At its
first write it opens a run (the flattened config as params) and keeps the run id in
``OUTPUT_DIR/mlflow_run.json``; every write logs the scalars new since the last one with
``step = iteration``; at the end it logs the run's files as artifacts and ends the run
FINISHED, KILLED (stopped on purpose: a stop signal, after which ``--resume`` continues the same
run, or a search pruning the trial) or FAILED. A tracking
store that fails costs the training nothing: one warning line, and the writer stops tracking.

For studies (reid-tune): :func:`start_parent_run` opens the parent run whose id the trials get
as MLFLOW.PARENT_RUN_ID, :func:`end_run` ends it.

The default store is SQLite (``OUTPUT_DIR/mlruns/mlflow.db``, artifacts beside it): MLflow 3.13+
refuses its file store (``./mlruns``) unless ``MLFLOW_ALLOW_FILE_STORE=true``, and SQLite needs
SQLAlchemy and alembic, which the ``mlflow`` extra installs with mlflow-skinny.
"""
import contextlib
import importlib.util
import json
import logging
import os
import re
import sys
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

from ..config import CfgNode, ConfigError
from ..inference.rank_vis import RANK_VIS_FILE
from ..reliability import preemption
from ..utils.errors import MissingPackageError, ReidUserError
from ..utils.events import EventWriter, collect_new_scalars, get_event_storage
from ..utils.file_io import atomic_write_text
from ..utils.urls import mask_password, sqlite_file
from .trainer_base import TrainingStopped

__all__ = [
    "RUN_RECORD_FILE",
    "MlflowTrackingError",
    "MLflowWriter",
    "check_mlflow_config",
    "resolve_tracking_uri",
    "flatten_params",
    "read_run_record",
    "start_parent_run",
    "end_run",
    "log_run_summary",
]

logger = logging.getLogger(__name__)

#: the file in OUTPUT_DIR that names the run's MLflow run (a resumed training continues it)
RUN_RECORD_FILE = "mlflow_run.json"
#: the default store's folder in OUTPUT_DIR: the SQLite database and the artifacts
DEFAULT_STORE_DIR = "mlruns"
_DEFAULT_DB_FILE = "mlflow.db"
_ARTIFACT_DIR = "mlartifacts"
#: the OUTPUT_DIR files logged as artifacts when a run ends (those that exist)
RUN_ARTIFACTS = ("config.yaml", "metrics.json", RANK_VIS_FILE, "log.txt")
INSTALL_HINT = "pip install 'reid_engine[mlflow]'"
#: MLflow's limits (mlflow.utils.validation): characters of a param value and of a key,
#: params and metrics per log_batch call
MAX_PARAM_VALUE_LENGTH = 6000
MAX_KEY_LENGTH = 250
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
_TRUNCATED_NOTE = " ...[truncated: the full value is in config.yaml]"
#: what MLflow accepts in param and metric names; anything else becomes "_"
_BAD_KEY_CHARS = re.compile(r"[^\w\-. /:]")
_STATUSES = ("FINISHED", "FAILED", "KILLED")


class MlflowTrackingError(ReidUserError):
    """The MLflow tracking store could not be reached or refused a request (one line: the URI, the error)."""


# ---------------------------------------------------------------------------- config
def check_mlflow_config(cfg: CfgNode) -> None:
    """Check MLFLOW.* before a run starts: mlflow (and SQLite's packages) installed, an experiment named.

    Raises:
        MissingPackageError: MLFLOW.ENABLED without mlflow, or a SQLite store without SQLAlchemy / alembic.
        ConfigError: an empty MLFLOW.EXPERIMENT.
    """
    if not cfg.MLFLOW.ENABLED:
        return
    if importlib.util.find_spec("mlflow") is None:
        raise MissingPackageError(f"MLFLOW.ENABLED needs mlflow: {INSTALL_HINT}")
    if not cfg.MLFLOW.EXPERIMENT.strip():
        raise ConfigError("MLFLOW.EXPERIMENT is empty: name the MLflow experiment the runs go to (default reid_engine)")
    uri = resolve_tracking_uri(cfg)
    missing = [m for m in ("sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
    if uri.startswith("sqlite:") and missing:
        raise MissingPackageError(f"the MLflow store {uri} (MLFLOW.TRACKING_URI) is SQLite, which needs "
                                  f"{' and '.join(missing)}: {INSTALL_HINT}, or set MLFLOW.TRACKING_URI to a server")


def resolve_tracking_uri(cfg: CfgNode) -> str:
    """The tracking store of `cfg`'s run.

    Returns:
        MLFLOW.TRACKING_URI; when empty, the MLFLOW_TRACKING_URI environment variable; when
        unset too, the SQLite store ``sqlite:///<OUTPUT_DIR>/mlruns/mlflow.db`` (absolute path).
    """
    uri = cfg.MLFLOW.TRACKING_URI.strip() or os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        return uri
    return "sqlite:///" + os.path.join(os.path.abspath(cfg.OUTPUT_DIR), DEFAULT_STORE_DIR, _DEFAULT_DB_FILE)


def _artifact_location(uri: str) -> Optional[str]:
    """Where a new experiment of a local SQLite store keeps its artifacts: beside the database
    (MLflow's default is relative to the working directory). None: the store decides."""
    db = sqlite_file(uri)
    if db is None:
        return None
    from pathlib import Path

    return Path(os.path.dirname(db), _ARTIFACT_DIR).as_uri()




def _one_line(error: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (passwords of URIs masked), at most `limit` characters."""
    lines = str(error).strip().splitlines()
    text = mask_password(f"{type(error).__name__}: {lines[0] if lines else ''}")
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------------------- params
def flatten_params(node: Mapping, prefix: str = "") -> Dict[str, str]:
    """Flatten a (nested) mapping such as a config into ``{"MODEL.BACKBONE.NAME": "build_resnet_backbone"}``.

    Values become strings (lists and tuples as Python writes them).
    """
    flat: Dict[str, str] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, name + "."))
        else:
            flat[name] = str(value)
    return flat


def _mlflow_key(name: str) -> str:
    """`name` as MLflow accepts it: unsupported characters as "_", at most MAX_KEY_LENGTH characters."""
    return _BAD_KEY_CHARS.sub("_", name)[:MAX_KEY_LENGTH]


def _param_value(value: str) -> str:
    """`value` cut to MLflow's limit, with a note saying so."""
    if len(value) <= MAX_PARAM_VALUE_LENGTH:
        return value
    return value[:MAX_PARAM_VALUE_LENGTH - len(_TRUNCATED_NOTE)] + _TRUNCATED_NOTE


def _chunks(items: List, size: int) -> Iterator[List]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _log_params(client, run_id: str, params: Mapping[str, str], existing: Optional[Mapping[str, str]] = None) -> List[str]:
    """Log `params` (chunked, long values cut); keys already in `existing` are kept as they are.

    Returns:
        the keys whose value differs from the one `existing` holds (MLflow never changes a param).
    """
    from mlflow.entities import Param

    existing = existing or {}
    values = {_mlflow_key(k): _param_value(v) for k, v in params.items()}
    changed = sorted(k for k, v in values.items() if k in existing and existing[k] != v)
    new = [Param(k, v) for k, v in values.items() if k not in existing]
    for chunk in _chunks(new, MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=chunk)
    return changed


# ---------------------------------------------------------------------------- store
def _client(uri: str):
    """An MlflowClient of `uri` (a local SQLite store's folder is created)."""
    from mlflow.tracking import MlflowClient

    db = sqlite_file(uri)
    if db is not None:
        os.makedirs(os.path.dirname(db), exist_ok=True)
    return MlflowClient(tracking_uri=uri)


def _experiment_id(client, name: str, uri: str) -> str:
    """The id of experiment `name`, created when missing.

    Raises:
        MlflowTrackingError: the experiment exists but was deleted.
    """
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=_artifact_location(uri))
        except Exception:
            experiment = client.get_experiment_by_name(name)  # another process created it meanwhile
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        raise MlflowTrackingError(f"the MLflow experiment '{name}' at {mask_password(uri)} is deleted "
                                  "(MLFLOW.EXPERIMENT): restore it (mlflow experiments restore) or name another one")
    return experiment.experiment_id


def _create_run(client, uri: str, experiment: str, run_name: str, tags: Mapping[str, str]):
    """Create a run in `experiment` (created when missing); returns its RunInfo."""
    experiment_id = _experiment_id(client, experiment, uri)
    return client.create_run(experiment_id, run_name=run_name or None, tags=dict(tags)).info


def _tracking_failure(uri: str, error: Exception) -> MlflowTrackingError:
    return MlflowTrackingError(f"MLflow tracking at {mask_password(uri)} failed ({_one_line(error)}): check "
                               "MLFLOW.TRACKING_URI (or MLFLOW_TRACKING_URI) and that its server is up")


def start_parent_run(tracking_uri: str, experiment: str, run_name: str, params: Mapping[str, Any],
                     tags: Optional[Mapping[str, str]] = None) -> str:
    """Open the parent run of a study: its trials, trained with MLFLOW.PARENT_RUN_ID set to the
    returned id, become its nested runs.

    Args:
        tracking_uri: the store (e.g. :func:`resolve_tracking_uri` of the study's base config).
        experiment: experiment name, created when missing.
        run_name: the run's name ("" for MLflow's own).
        params: logged as params (a nested mapping is flattened with ".").
        tags: extra run tags.
    Returns:
        the run id (the run stays RUNNING until :func:`end_run`).
    Raises:
        MlflowTrackingError: the store cannot be reached or refused the run (one line).
    """
    try:
        client = _client(tracking_uri)
        run_id = _create_run(client, tracking_uri, experiment, run_name, tags or {}).run_id
        _log_params(client, run_id, flatten_params(params))
    except MlflowTrackingError:
        raise
    except Exception as e:
        raise _tracking_failure(tracking_uri, e) from e
    return run_id


def end_run(tracking_uri: str, run_id: str, status: str = "FINISHED", artifacts: Sequence[str] = ()) -> None:
    """End run `run_id` with `status` (FINISHED, FAILED or KILLED), after attaching `artifacts`.

    Args:
        artifacts: paths of files to log into the run's artifact root first (missing ones are skipped).
    Raises:
        ValueError: an unknown status.
        MlflowTrackingError: the store cannot be reached or refused it (one line).
    """
    if status not in _STATUSES:
        raise ValueError(f"status must be one of {', '.join(_STATUSES)}, got {status!r}")
    try:
        client = _client(tracking_uri)
        for path in artifacts:
            if os.path.isfile(path):
                client.log_artifact(run_id, path)
        client.set_terminated(run_id, status=status)
    except Exception as e:
        raise _tracking_failure(tracking_uri, e) from e


# ---------------------------------------------------------------------------- run record
def read_run_record(output_dir: str) -> Optional[dict]:
    """The content of ``<output_dir>/mlflow_run.json`` (run_id, tracking_uri, experiment_id,
    last_step, status), or None when there is none or it cannot be read."""
    try:
        with open(os.path.join(output_dir, RUN_RECORD_FILE), "r", encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("run_id") else None


def _completed_status(completed: bool) -> str:
    """How the training that is ending ended, for the run status: FINISHED when it completed,
    KILLED when stopped on purpose (a stop signal: ``--resume`` continues it; a pruned trial),
    FAILED otherwise."""
    if completed:
        return "FINISHED"
    # close() runs in the trainer's `finally`, while the stopping exception propagates; a worker
    # that stops because another one was signalled has no signal of its own.
    stopping = sys.exc_info()[1]
    if isinstance(stopping, (preemption.TrainingPreempted, TrainingStopped)) or preemption.requested_signal():
        return "KILLED"
    return "FAILED"


class MLflowWriter(EventWriter):
    """Log a training run to MLflow: config as params, new scalars as metrics (step =
    iteration), the run's files as artifacts, and its end status.

    The run is opened at the first write. A resumed training (``resumed()`` true) with a
    ``mlflow_run.json`` of the same store continues that run: params it lacks are added (a
    param never changes in MLflow: changed values are logged as one info line), and the steps
    it already has are not logged again. Any failure of the store logs one warning naming the
    URI and the error; the writer then does nothing more and the training goes on.
    """

    def __init__(self, cfg: CfgNode, max_iter: int, resumed: Optional[Callable[[], bool]] = None,
                 window_size: int = 20):
        """
        Args:
            cfg: the run's config (MLFLOW.*, OUTPUT_DIR; all of it is logged as params).
            max_iter: the training's length: a run that reached it ended FINISHED.
            resumed: called at the first write: whether this training continues from a checkpoint
                of OUTPUT_DIR (the trainer's start_iter > 0). None: never.
            window_size: smoothing window (iterations) for scalars with a smoothing hint.
        Raises:
            MissingPackageError: mlflow is not installed.
        """
        if importlib.util.find_spec("mlflow") is None:
            raise MissingPackageError(f"MLFLOW.ENABLED needs mlflow: {INSTALL_HINT}")
        self._cfg = cfg
        self._uri = resolve_tracking_uri(cfg)
        self._output_dir = cfg.OUTPUT_DIR
        self._max_iter = int(max_iter)
        self._resumed = resumed if resumed is not None else (lambda: False)
        self._window_size = window_size
        self._run_id: Optional[str] = None
        self._experiment_id = ""
        self._last_write = -1
        self._disabled = False
        self._client = None
        with self._guard("connecting"):
            # Import mlflow and reach the store now, not inside the training loop (a new SQLite
            # store creates its tables: seconds); a store that fails is one warning before training.
            self._client = _client(self._uri)
            self._client.search_experiments(max_results=1)

    @property
    def run_id(self) -> Optional[str]:
        """The MLflow run id (None before the first write, or when tracking failed at the start)."""
        return self._run_id

    @property
    def tracking_uri(self) -> str:
        """The tracking store this writer logs to."""
        return self._uri

    @contextlib.contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        """Turn a failure of the store into one warning and stop tracking (the training goes on)."""
        try:
            yield
        except Exception as e:
            self._disabled = True
            logger.warning(f"MLflow tracking at {mask_password(self._uri)} failed while {doing} ({_one_line(e)}); "
                           "the training goes on without it (metrics.json has every metric)")

    def _save_record(self, status: str = "RUNNING") -> None:
        record = {"run_id": self._run_id, "tracking_uri": self._uri, "experiment_id": self._experiment_id,
                  "last_step": self._last_write, "status": status}
        atomic_write_text(os.path.join(self._output_dir, RUN_RECORD_FILE), json.dumps(record, indent=1) + "\n")

    def _continue_run(self, record: dict) -> bool:
        """Reopen the run of `record` (a resumed training); False when it is gone (deleted)."""
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(record["run_id"])
        except MlflowException as e:
            if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        if run.info.lifecycle_stage == "deleted":
            return False
        self._run_id, self._experiment_id = run.info.run_id, run.info.experiment_id
        self._last_write = int(record.get("last_step", -1))
        self._client.update_run(self._run_id, status="RUNNING")
        changed = _log_params(self._client, self._run_id, flatten_params(self._cfg), run.data.params)
        if changed:
            shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
            logger.info(f"MLflow run {self._run_id}: the config changed since the run started ({shown}); its params "
                        "keep their first values (config.yaml, logged at the end, has the new ones)")
        logger.info(f"MLflow: continuing run {self._run_id} at {mask_password(self._uri)} after step {self._last_write}")
        return True

    def _start(self) -> None:
        """Open the run: continue the recorded one when resuming, else create one."""
        record = read_run_record(self._output_dir)
        if record is not None and record.get("tracking_uri") == self._uri and self._resumed():
            if self._continue_run(record):
                return
        with contextlib.suppress(FileNotFoundError):  # another training's record: never attach to it
            os.remove(os.path.join(self._output_dir, RUN_RECORD_FILE))
        mlflow_cfg = self._cfg.MLFLOW
        run_name = mlflow_cfg.RUN_NAME or os.path.basename(os.path.normpath(os.path.abspath(self._output_dir)))
        tags = {"reid_engine.output_dir": os.path.abspath(self._output_dir)}
        if mlflow_cfg.PARENT_RUN_ID:
            tags["mlflow.parentRunId"] = mlflow_cfg.PARENT_RUN_ID
        info = _create_run(self._client, self._uri, mlflow_cfg.EXPERIMENT, run_name, tags)
        self._run_id, self._experiment_id = info.run_id, info.experiment_id
        self._last_write = -1
        self._save_record()
        _log_params(self._client, self._run_id, flatten_params(self._cfg))
        logger.info(f"MLflow: tracking run {self._run_id} ('{run_name}', experiment '{mlflow_cfg.EXPERIMENT}') "
                    f"at {mask_password(self._uri)}")

    def write(self) -> None:
        """Log the scalars new since the last write (step = their iteration); opens the run the first time."""
        if self._disabled:
            return
        with self._guard("logging metrics"):
            if self._run_id is None:
                self._start()
            new = collect_new_scalars(get_event_storage(), self._window_size, self._last_write)
            if not new:
                return
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            metrics = [Metric(_mlflow_key(name), value, now, itr)
                       for itr, scalars in new.items() for name, value in scalars.items()]
            for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
                self._client.log_batch(self._run_id, metrics=chunk)
            self._last_write = max(new)
            self._save_record()

    def close(self) -> None:
        """Log the run's files (config.yaml, metrics.json, ranks.png, log.txt) and end the run:
        FINISHED (completed), KILLED (stopped on purpose: a signal, after which --resume continues
        it, or a pruned trial) or FAILED (an error)."""
        if self._disabled:
            return
        try:
            iteration = get_event_storage().iter
        except RuntimeError:  # closed outside a training
            if self._run_id is None:
                return
            iteration = self._last_write + 1
        status = _completed_status(iteration >= self._max_iter)
        with self._guard("ending the run"):
            if self._run_id is None:  # stopped before its first write: the run still records why (log.txt)
                self._start()
            self._log_files(RUN_ARTIFACTS)
            self._client.set_terminated(self._run_id, status=status)
            self._save_record(status)
        self._disabled = True  # closed: nothing more to log

    def _log_files(self, names: Iterable[str]) -> None:
        for name in names:
            path = os.path.join(self._output_dir, name)
            if os.path.isfile(path):
                self._client.log_artifact(self._run_id, path)


def log_run_summary(cfg: CfgNode, summary: str) -> None:
    """Attach a completed run's summary (``summary.txt``) and its final log.txt to its MLflow run.

    A no-op unless MLFLOW.ENABLED and ``mlflow_run.json`` records a FINISHED run (a writer that
    failed stopped tracking: nothing is tried again). A failure is one warning line.
    """
    if not cfg.MLFLOW.ENABLED:
        return
    record = read_run_record(cfg.OUTPUT_DIR)
    if record is None or record.get("status") != "FINISHED":
        return
    uri = record.get("tracking_uri") or resolve_tracking_uri(cfg)
    try:
        client = _client(uri)
        client.log_text(record["run_id"], summary, "summary.txt")
        log_file = os.path.join(cfg.OUTPUT_DIR, "log.txt")
        if os.path.isfile(log_file):
            client.log_artifact(record["run_id"], log_file)
    except Exception as e:
        logger.warning(f"MLflow tracking at {mask_password(uri)} failed while logging the run summary ({_one_line(e)})")
