"""MLFLOW.*: training runs in MLflow through its own API: ``mlflow.start_run(parent_run_id=...)``, the run id
kept in ``OUTPUT_DIR/mlflow_run.json`` (a resumed training continues it), ``MlflowClient.log_batch(...,
synchronous=False)`` (MLflow splits, sends from its own thread and truncates long values)."""
import contextlib
import importlib.util
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence

from ..config import CfgNode, ConfigError
from ..utils.errors import MissingPackageError, ReidUserError, first_line
from ..utils.events import EventWriter, collect_new_scalars, get_event_storage
from ..utils.file_io import atomic_write_text
from ..utils.urls import mask_password, sqlite_file

__all__ = ["RUN_RECORD_FILE", "MlflowTrackingError", "MLflowWriter", "check_mlflow_config", "resolve_tracking_uri",
           "flatten_params", "read_run_record", "start_parent_run", "end_run", "log_run_summary"]

logger = logging.getLogger(__name__)

RUN_RECORD_FILE = "mlflow_run.json"
RUN_ARTIFACTS = ("config.yaml", "metrics.json", "log.txt")  # logged when a run ends (those that exist)
INSTALL_HINT = "pip install 'reid_engine[mlflow]'"
_BAD_NAME_CHARS = re.compile(r"[^\w\-. /:]")  # what MLflow accepts in names; the rest becomes "_"


class MlflowTrackingError(ReidUserError):
    """The MLflow store could not be reached or refused a request (one line: the URI, the error)."""


def _require_mlflow() -> None:
    if importlib.util.find_spec("mlflow") is None:
        raise MissingPackageError(f"MLFLOW.ENABLED needs mlflow: {INSTALL_HINT}")


def check_mlflow_config(cfg: CfgNode) -> None:
    """Check MLFLOW.* before a run: mlflow (for SQLite with SQLAlchemy and alembic) installed, an experiment named."""
    if not cfg.MLFLOW.ENABLED:
        return
    _require_mlflow()
    if not cfg.MLFLOW.EXPERIMENT.strip():
        raise ConfigError("MLFLOW.EXPERIMENT is empty: name the MLflow experiment the runs go to (default reid_engine)")
    uri, missing = resolve_tracking_uri(cfg), [m for m in ("sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
    if uri.startswith("sqlite:") and missing:
        raise MissingPackageError(f"the MLflow store {uri} (MLFLOW.TRACKING_URI) is SQLite, which needs "
                                  f"{' and '.join(missing)}: {INSTALL_HINT}, or set MLFLOW.TRACKING_URI to a server")


def resolve_tracking_uri(cfg: CfgNode) -> str:
    """MLFLOW.TRACKING_URI, else $MLFLOW_TRACKING_URI, else ``sqlite:///<abs OUTPUT_DIR>/mlruns/mlflow.db``."""
    uri = cfg.MLFLOW.TRACKING_URI.strip() or os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    return uri or "sqlite:///" + os.path.join(os.path.abspath(cfg.OUTPUT_DIR), "mlruns", "mlflow.db")


def _failed(uri: str, doing: str, error: BaseException) -> str:
    return mask_password(f"MLflow tracking at {uri} failed while {doing} ({type(error).__name__}: "
                         f"{first_line(error)[:300]})")


def flatten_params(node: Mapping, prefix: str = "") -> Dict[str, str]:
    """Flatten a nested mapping (a config) into ``{"MODEL.BACKBONE.NAME": "build_resnet_backbone"}``, values as text."""
    flat: Dict[str, str] = {}
    for key, value in node.items():
        flat.update(flatten_params(value, f"{prefix}{key}.") if isinstance(value, Mapping) else
                    {f"{prefix}{key}": str(value)})
    return flat


def _params(params: Mapping, existing: Mapping[str, str] = None) -> list:
    """MLflow Params of `params` (flattened), but those `existing` already has."""
    from mlflow.entities import Param

    return [Param(k, v) for k, v in flatten_params(params).items() if k not in (existing or {})]


def _client(uri: str):
    """An MlflowClient of `uri` (a local SQLite store's folder is created)."""
    from mlflow.tracking import MlflowClient

    if sqlite_file(uri) is not None:
        os.makedirs(os.path.dirname(sqlite_file(uri)), exist_ok=True)
    return MlflowClient(tracking_uri=uri)


def _experiment_id(client, name: str, uri: str) -> str:
    """The id of experiment `name`, created when missing (a SQLite store's artifacts beside its database)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        db = sqlite_file(uri)
        with contextlib.suppress(Exception):  # another process may create it meanwhile
            return client.create_experiment(name, artifact_location=db and Path(db).parent.joinpath("mlartifacts")
                                            .as_uri())
        experiment = client.get_experiment_by_name(name)
    if experiment is None or experiment.lifecycle_stage == "deleted":
        raise MlflowTrackingError(f"the MLflow experiment '{name}' at {mask_password(uri)} is deleted or cannot be "
                                  "created (MLFLOW.EXPERIMENT): restore it (mlflow experiments restore) or name another")
    return experiment.experiment_id


@contextlib.contextmanager
def _store_errors(uri: str, doing: str) -> Iterator[None]:
    """Any failure of the store as one :class:`MlflowTrackingError` line."""
    try:
        yield
    except MlflowTrackingError:
        raise
    except Exception as e:
        raise MlflowTrackingError(_failed(uri, doing, e) + ": check MLFLOW.TRACKING_URI (or MLFLOW_TRACKING_URI) "
                                  "and that its server is up") from e


def start_parent_run(tracking_uri: str, experiment: str, run_name: str, params: Mapping,
                     tags: Optional[Mapping[str, str]] = None) -> str:
    """Open a study's parent run (params flattened); returns its id, the trials' MLFLOW.PARENT_RUN_ID."""
    with _store_errors(tracking_uri, "opening the study's run"):
        client = _client(tracking_uri)
        run_id = client.create_run(_experiment_id(client, experiment, tracking_uri), run_name=run_name or None,
                                   tags=dict(tags or {})).info.run_id
        client.log_batch(run_id, params=_params(params))
    return run_id


def end_run(tracking_uri: str, run_id: str, status: str = "FINISHED", artifacts: Sequence[str] = ()) -> None:
    """Attach the files `artifacts` (those that exist) to run `run_id` and end it with `status`
    (FINISHED, FAILED or KILLED: MLflow refuses others)."""
    with _store_errors(tracking_uri, "ending a run"):
        client = _client(tracking_uri)
        for path in filter(os.path.isfile, artifacts):
            client.log_artifact(run_id, path)
        client.set_terminated(run_id, status=status)


def read_run_record(output_dir: str) -> Optional[dict]:
    """``<output_dir>/mlflow_run.json`` (run_id, tracking_uri, experiment_id, last_step, status), or None."""
    try:
        with open(os.path.join(output_dir, RUN_RECORD_FILE), "r", encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("run_id") else None


@contextlib.contextmanager
def _fluent_uri(uri: str) -> Iterator[None]:
    """The fluent API's tracking URI for a block (and $MLFLOW_TRACKING_URI, which MLflow sets with it)."""
    import mlflow

    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)  # None: unset, as it was


class MLflowWriter(EventWriter):
    """Log a training run to MLflow: `cfg` as params, new scalars as metrics (step = iteration), `artifacts`
    at the end, and FINISHED at `max_iter`, else KILLED if `stopped_on_purpose()`, else FAILED; `resumed()`
    (asked at the first write): the training continues OUTPUT_DIR's checkpoint, so it continues the run."""

    def __init__(self, cfg: CfgNode, max_iter: int, resumed: Optional[Callable[[], bool]] = None,
                 stopped_on_purpose: Optional[Callable[[], bool]] = None, artifacts: Sequence[str] = RUN_ARTIFACTS,
                 window_size: int = 20):
        _require_mlflow()
        self._cfg, self._uri, self._output_dir, self._max_iter = cfg, resolve_tracking_uri(cfg), cfg.OUTPUT_DIR, max_iter
        self._resumed, self._stopped_on_purpose = resumed or (lambda: False), stopped_on_purpose or (lambda: False)
        self._artifacts, self._window_size = tuple(artifacts), window_size
        self.run_id: Optional[str] = None  # None before the first write, or when tracking failed at the start
        self._experiment_id, self._last_write, self._confirmed, self._disabled, self._sent = "", -1, -1, False, None
        # A failed asynchronous batch reaches this writer (one warning); MLflow's queue would log its traceback too.
        logging.getLogger("mlflow.utils.async_logging").setLevel(logging.CRITICAL)
        with self._guard("connecting"):  # import mlflow and reach the store before the loop: one warning if it fails
            self._client = _client(self._uri)
            self._client.search_experiments(max_results=1)

    @contextlib.contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        """A failure of the store is one warning, and the writer stops tracking (the training goes on)."""
        try:
            yield
        except Exception as e:
            self._disabled = True
            with contextlib.suppress(Exception):
                self._leave("FAILED")
            logger.warning(_failed(self._uri, doing, e) + "; the training goes on without it (metrics.json has "
                           "every metric)")

    def _leave(self, status: str) -> None:
        """End this writer's run of the fluent API (MLflow pops it from its stack first, even if the store fails)."""
        import mlflow

        with _fluent_uri(self._uri):
            mlflow.end_run(status)  # a no-op without an active run

    def _save_record(self, status: str = "RUNNING") -> None:
        record = {"run_id": self.run_id, "tracking_uri": self._uri, "experiment_id": self._experiment_id,
                  "last_step": self._confirmed, "status": status}
        atomic_write_text(os.path.join(self._output_dir, RUN_RECORD_FILE), json.dumps(record, indent=1) + "\n")

    def _start(self) -> None:
        """Open the run: mlflow.start_run continues the recorded one when resuming (unless deleted meanwhile:
        search_runs finds active runs only), else creates one; another training's record is never attached to."""
        import mlflow

        record, options = read_run_record(self._output_dir), self._cfg.MLFLOW
        resume = record is not None and record.get("tracking_uri") == self._uri and self._resumed() and bool(
            self._client.search_runs([record.get("experiment_id", "0")], f"attributes.run_id = '{record['run_id']}'"))
        if not resume:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self._output_dir, RUN_RECORD_FILE))
        name = options.RUN_NAME or os.path.basename(os.path.normpath(os.path.abspath(self._output_dir)))
        with _fluent_uri(self._uri):
            run = mlflow.start_run(**({"run_id": record["run_id"]} if resume else {
                "experiment_id": _experiment_id(self._client, options.EXPERIMENT, self._uri), "run_name": name,
                "parent_run_id": options.PARENT_RUN_ID or None,
                "tags": {"reid_engine.output_dir": os.path.abspath(self._output_dir)}}))
        self.run_id, self._experiment_id = run.info.run_id, run.info.experiment_id
        self._last_write = self._confirmed = int(record.get("last_step", -1)) if resume else -1
        existing = self._client.get_run(self.run_id).data.params if resume else {}
        self._client.log_batch(self.run_id, params=_params(self._cfg, existing))
        self._save_record()
        logger.info(f"MLflow: {'continuing' if resume else 'tracking'} run {self.run_id} ('{run.info.run_name}', "
                    f"experiment '{options.EXPERIMENT}') at {mask_password(self._uri)}")

    def write(self) -> None:
        """Send the scalars new since the last write (step = their iteration), without waiting for the store."""
        if self._disabled:
            return
        with self._guard("logging metrics"):
            if self.run_id is None:
                self._start()
            new = collect_new_scalars(get_event_storage(), self._window_size, self._last_write)
            if not new:
                return
            self._confirm()  # the previous batch: sent a period ago, so done by now (its failure raises here)
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            metrics = [Metric(_BAD_NAME_CHARS.sub("_", name), value, now, itr)
                       for itr, scalars in new.items() for name, value in scalars.items()]
            self._sent = (self._client.log_batch(self.run_id, metrics=metrics, synchronous=False), max(new))
            self._last_write = max(new)

    def _confirm(self) -> None:
        """Wait for the batch on its way; the record then names its last step (a resume logs what follows)."""
        if self._sent is not None:
            (operations, step), self._sent = self._sent, None
            operations.wait()
            self._confirmed = step
            self._save_record()

    def close(self) -> None:
        """Wait for the metrics on their way, log the run's files and end the run FINISHED, KILLED or FAILED."""
        if self._disabled:
            return
        try:
            completed = get_event_storage().iter >= self._max_iter
        except RuntimeError:  # closed outside a training
            if self.run_id is None:
                return
            completed = self._last_write + 1 >= self._max_iter
        status = "FINISHED" if completed else "KILLED" if self._stopped_on_purpose() else "FAILED"
        with self._guard("ending the run"):
            if self.run_id is None:  # stopped before its first write: the run still records why (log.txt)
                self._start()
            self._confirm()
            for path in (os.path.join(self._output_dir, name) for name in self._artifacts):
                if os.path.isfile(path):
                    self._client.log_artifact(self.run_id, path)
            self._leave(status)
            self._save_record(status)
        self._disabled = True


def log_run_summary(cfg: CfgNode, summary: str) -> None:
    """Attach a FINISHED run's ``summary.txt`` and final log.txt to its MLflow run; a failure is one warning."""
    record = read_run_record(cfg.OUTPUT_DIR) if cfg.MLFLOW.ENABLED else None
    if record is None or record.get("status") != "FINISHED":
        return
    uri, log_file = record.get("tracking_uri") or resolve_tracking_uri(cfg), os.path.join(cfg.OUTPUT_DIR, "log.txt")
    try:
        client = _client(uri)
        client.log_text(record["run_id"], summary, "summary.txt")
        if os.path.isfile(log_file):
            client.log_artifact(record["run_id"], log_file)
    except Exception as e:
        logger.warning(_failed(uri, "logging the run summary", e))
