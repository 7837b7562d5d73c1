"""MLFLOW.*: runs tracked in a real local MLflow store (SQLite in tmp_path, no server), read back
with MlflowClient: params, metric histories and their steps, artifacts, end status, resume into
the same run, nested runs of a study, and a store that fails during training."""
import importlib.util
import json
import logging
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from reid_engine.config import ConfigError, get_cfg
from reid_engine.engine.config_checks import check_config_values
from reid_engine.engine.defaults import stopped_on_purpose
from reid_engine.engine.hooks import PeriodicWriter
from reid_engine.engine.train_loop import HookBase
from reid_engine.engine.trainer_base import TrainingStopped
from reid_engine.integrations.event_writers import JSONWriter
from reid_engine.integrations.mlflow import (
    RUN_RECORD_FILE,
    MlflowTrackingError,
    MLflowWriter,
    check_mlflow_config,
    end_run,
    read_run_record,
    resolve_tracking_uri,
    start_parent_run,
)
from reid_engine.reliability.preemption import TrainingPreempted
from reid_engine.utils.errors import MissingPackageError, ReidUserError
from tests.conftest import records_of
from tests.engine._engine_fixtures import TINY_CONFIG, NoOpTrainer, one_torch_thread  # noqa: F401 (a fixture)

_MISSING = [m for m in ("mlflow", "sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
needs_mlflow = pytest.mark.skipif(bool(_MISSING), reason=f"MLflow tracking needs {', '.join(_MISSING)} "
                                  "(pip install 'reid_engine[mlflow]')")


@pytest.fixture(scope="module")
def empty_store_db(tmp_path_factory):
    """An empty SQLite store, made once per module (creating MLflow's tables takes seconds)."""
    db = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    _client("sqlite:///" + str(db)).search_experiments()
    return db


def _copy_store(empty_store_db, db_path):
    """A new store at `db_path`, copied from the empty one; returns its URI."""
    os.makedirs(os.path.dirname(db_path), exist_ok=True)
    shutil.copyfile(empty_store_db, db_path)
    return "sqlite:///" + str(db_path)


@pytest.fixture
def store_uri(empty_store_db, tmp_path):
    """A fresh SQLite store of this test."""
    return _copy_store(empty_store_db, tmp_path / "store" / "mlflow.db")


def _client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _writer_cfg(out, uri, experiment, *opts):
    cfg = get_cfg()
    cfg.merge_from_list(["OUTPUT_DIR", str(out), "MLFLOW.ENABLED", True, "MLFLOW.TRACKING_URI", uri,
                         "MLFLOW.EXPERIMENT", experiment, *opts])
    cfg.freeze()
    return cfg


class _Scalars(HookBase):
    """Writes a loss, the lr and (every 5th step) an evaluation result whose name MLflow does not accept as is."""

    def after_step(self):
        it = self.trainer.iter
        self.trainer.storage.put_scalar("total_loss", 10.0 - 0.1 * it, smoothing_hint=False)
        self.trainer.storage.put_scalar("lr", 0.01, smoothing_hint=False)
        if (it + 1) % 5 == 0:
            self.trainer.storage.put_scalar("Tiny/TPR@FPR=1e-04", it / 100.0, smoothing_hint=False)


class _AtIteration(HookBase):
    """Calls ``action(trainer)`` after iteration `at`."""

    def __init__(self, at, action):
        self._at, self._action = at, action

    def after_step(self):
        if self.trainer.iter == self._at:
            self._action(self.trainer)


def _noop_training(cfg, max_iter, *hooks, start_iter=0, resumed=False):
    """A model-free training loop with the metrics.json and MLflow writers (period 5); returns the MLflow writer."""
    writer = MLflowWriter(cfg, max_iter, resumed=lambda: resumed, stopped_on_purpose=stopped_on_purpose)
    trainer = NoOpTrainer()
    trainer.register_hooks([_Scalars(), *hooks, PeriodicWriter(
        [JSONWriter(os.path.join(cfg.OUTPUT_DIR, "metrics.json")), writer], period=5)])
    trainer.train(start_iter, max_iter)
    return writer


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("reid_engine")]


def _steps(client, run_id, key):
    return [m.step for m in client.get_metric_history(run_id, key)]


# ---------------------------------------------------------------------------- config
def test_enabled_without_mlflow_is_one_line_naming_the_extra(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real_find_spec(name, *a))
    cfg = get_cfg()
    cfg.merge_from_list(["OUTPUT_DIR", str(tmp_path / "out"), "MLFLOW.ENABLED", True])
    check_mlflow_config(get_cfg())  # off: nothing is checked
    with pytest.raises(MissingPackageError) as err:
        check_config_values(cfg)  # where every run checks its config
    assert str(err.value) == "MLFLOW.ENABLED needs mlflow: pip install 'reid_engine[mlflow]'"
    assert isinstance(err.value, ReidUserError)
    assert not (tmp_path / "out").exists()


def test_sqlite_store_without_alembic_is_one_line(monkeypatch, tmp_path):
    real_find_spec, faked = importlib.util.find_spec, {"mlflow": object(), "alembic": None}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: faked[name] if name in faked else real_find_spec(name, *a))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = get_cfg()
    cfg.merge_from_list(["OUTPUT_DIR", str(tmp_path), "MLFLOW.ENABLED", True])
    with pytest.raises(MissingPackageError, match=r"^the MLflow store sqlite:///.* is SQLite, which needs alembic: "
                                                  r"pip install 'reid_engine\[mlflow\]'"):
        check_mlflow_config(cfg)
    cfg.MLFLOW.TRACKING_URI = "http://127.0.0.1:5000"  # a server keeps its own database
    check_mlflow_config(cfg)
    cfg.MLFLOW.EXPERIMENT = " "
    with pytest.raises(ConfigError, match="^MLFLOW.EXPERIMENT is empty"):
        check_mlflow_config(cfg)


def test_tracking_uri_defaults_to_the_environment_then_a_sqlite_store_in_output_dir(monkeypatch, tmp_path):
    cfg = get_cfg()
    cfg.merge_from_list(["OUTPUT_DIR", str(tmp_path / "run")])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(cfg) == f"sqlite:///{tmp_path}/run/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert resolve_tracking_uri(cfg) == "http://127.0.0.1:5000"
    cfg.MLFLOW.TRACKING_URI = "sqlite:///elsewhere.db"
    assert resolve_tracking_uri(cfg) == "sqlite:///elsewhere.db"


# ---------------------------------------------------------------------------- writer
@pytest.mark.slow
@needs_mlflow
def test_preempted_run_ends_killed_and_resume_continues_the_same_run(store_uri, tmp_path):
    cfg = _writer_cfg(tmp_path, store_uri, "resume")

    def stop(trainer):
        raise TrainingPreempted.stopped(15, trainer.iter, str(tmp_path / "model_0000011.pth"))

    with pytest.raises(TrainingPreempted):
        _noop_training(cfg, 30, _AtIteration(11, stop))
    record = read_run_record(str(tmp_path))
    client = _client(store_uri)
    run = client.get_run(record["run_id"])
    assert run.info.status == "KILLED" and record["status"] == "KILLED"
    assert _steps(client, run.info.run_id, "total_loss") == [4, 9, 11]  # period 5, then the stop
    # The checkpoint was of iteration 7: iterations 8..11 are trained (and written) again.
    writer = _noop_training(cfg, 30, start_iter=8, resumed=True)
    assert writer.run_id == run.info.run_id
    assert client.get_run(writer.run_id).info.status == "FINISHED"
    steps = _steps(client, writer.run_id, "total_loss")
    assert steps == sorted(set(steps)) == [4, 9, 11, 14, 19, 24, 29]  # no step twice
    assert len(client.search_runs([run.info.experiment_id])) == 1
    # MLflow accepts [\w\-. /:] in names: the ROC metric's '@' and '=' become '_'
    assert _steps(client, writer.run_id, "Tiny/TPR_FPR_1e-04") == [4, 9, 14, 19, 24, 29]
    # A new training in the same folder (no resume) is a new run.
    fresh = _noop_training(cfg, 10)
    assert fresh.run_id != writer.run_id and read_run_record(str(tmp_path))["run_id"] == fresh.run_id


@needs_mlflow
def test_a_failed_run_ends_failed_and_a_pruned_one_killed(store_uri, tmp_path):
    def fail(trainer):
        raise RuntimeError("a bug")

    def prune(trainer):
        raise TrainingStopped("pruned: worse than the median of earlier trials", trainer.iter)

    client = _client(store_uri)
    with pytest.raises(RuntimeError):  # before the first write (iteration 4): the run is still opened, to say so
        _noop_training(_writer_cfg(tmp_path / "failed", store_uri, "ends"), 20, _AtIteration(1, fail))
    failed = client.get_run(read_run_record(str(tmp_path / "failed"))["run_id"])
    assert failed.info.status == "FAILED" and failed.data.params["MLFLOW.EXPERIMENT"] == "ends"
    assert [a.path for a in client.list_artifacts(failed.info.run_id)] == ["metrics.json"]
    with pytest.raises(TrainingStopped):
        _noop_training(_writer_cfg(tmp_path / "pruned", store_uri, "ends"), 20, _AtIteration(6, prune))
    pruned = client.get_run(read_run_record(str(tmp_path / "pruned"))["run_id"])
    assert pruned.info.status == "KILLED" and _steps(client, pruned.info.run_id, "total_loss") == [4, 6]


@needs_mlflow
def test_study_parent_and_nested_trial_runs(store_uri, tmp_path):
    long_value = "x" * 7000
    parent = start_parent_run(store_uri, "study", "study-1", {"sampler": "tpe", "space": {"lr": [1e-4, 1e-2]},
                                                              "long": long_value}, tags={"kind": "study"})
    client = _client(store_uri)
    params = client.get_run(parent).data.params
    assert params["sampler"] == "tpe" and params["space.lr"] == "[0.0001, 0.01]"
    assert params["long"] == long_value[:6000]  # MLflow truncates a long value itself (its limit: 6000)
    trials = [_noop_training(_writer_cfg(tmp_path / f"trial_{i}", store_uri, "study", "MLFLOW.PARENT_RUN_ID", parent,
                                         "SOLVER.BASE_LR", 0.001 * (i + 1)), 5).run_id for i in range(2)]
    end_run(store_uri, parent, "FINISHED")
    for i, run_id in enumerate(trials):
        run = client.get_run(run_id)
        assert run.data.tags["mlflow.parentRunId"] == parent
        assert run.info.run_name == f"trial_{i}" and run.info.status == "FINISHED"
        assert float(run.data.params["SOLVER.BASE_LR"]) == pytest.approx(0.001 * (i + 1))
    children = client.search_runs([client.get_run(parent).info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(r.info.run_id for r in children) == sorted(trials)
    assert client.get_run(parent).info.status == "FINISHED"
    with pytest.raises(MlflowTrackingError, match="DONE"):  # MLflow refuses an unknown status: one line
        end_run(store_uri, parent, "DONE")


@needs_mlflow
def test_store_failing_mid_run_is_one_warning_and_training_completes(store_uri, tmp_path, caplog):
    uri = store_uri
    cfg = _writer_cfg(tmp_path / "out", uri, "broken")

    def break_store(trainer):  # the database file is overwritten: every later request fails
        db = tmp_path / "store" / "mlflow.db"
        db.write_bytes(b"not a database" * 4096)

    with records_of(caplog, "reid_engine"):
        writer = _noop_training(cfg, 20, _AtIteration(7, break_store))
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"MLflow tracking at {uri} failed while logging metrics (") and "\n" not in warnings[0]
    lines = [json.loads(line) for line in open(tmp_path / "out" / "metrics.json")]
    assert lines[-1]["iteration"] == 19  # the training and its other writers went on to the end
    # The record names only steps the store confirmed (batches go out asynchronously): none after the break.
    assert read_run_record(str(tmp_path / "out"))["last_step"] < 7 and writer.run_id
    with pytest.raises(sqlite3.DatabaseError):
        sqlite3.connect(str(tmp_path / "store" / "mlflow.db")).execute("select * from runs").fetchall()


@needs_mlflow
def test_unreachable_server_is_one_warning_and_training_completes(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    uri = "http://user:secret@127.0.0.1:9"  # the discard port: nothing listens there
    cfg = _writer_cfg(tmp_path, uri, "unreachable")
    with records_of(caplog, "reid_engine"):
        writer = _noop_training(cfg, 12)
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("MLflow tracking at http://user:***@127.0.0.1:9 failed while connecting (")
    assert "secret" not in warnings[0]
    assert writer.run_id is None and not (tmp_path / RUN_RECORD_FILE).exists()
    assert [json.loads(line)["iteration"] for line in open(tmp_path / "metrics.json")] == [4, 9, 11]


# ---------------------------------------------------------------------------- a real training
@pytest.fixture(scope="module")
def trained(data_root, tmp_path_factory, empty_store_db):
    """A tiny `reid-train` run (in-process) with MLFLOW.ENABLED, the default store (OUTPUT_DIR/mlruns)
    and one evaluation with ranks.png, read back right after it ended (the resume test continues it)."""
    from reid_engine.cli.train import main

    out = tmp_path_factory.mktemp("tracked") / "tiny_run"
    store_uri = _copy_store(empty_store_db, out / "mlruns" / "mlflow.db")  # where the default store is
    args = ["--config-file", TINY_CONFIG, "DATASETS.ROOT", data_root, "OUTPUT_DIR", str(out),
            "MODEL.BACKBONE.WIDTH_MULT", "0.25", "INPUT.SIZE_TRAIN", "[32, 16]", "INPUT.SIZE_TEST", "[32, 16]",
            "SOLVER.MAX_EPOCH", "1", "TEST.EVAL_PERIOD", "1", "TEST.RANK_VIS", "True",
            "MLFLOW.ENABLED", "True", "MLFLOW.EXPERIMENT", "training"]
    with pytest.MonkeyPatch.context() as env:
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        assert main(args) == 0
    client = _client(store_uri)
    record = read_run_record(str(out))
    assert record["tracking_uri"] == store_uri
    run = client.get_run(record["run_id"])
    return {"args": args, "out": out, "client": client, "run": run,
            "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id)),
            "loss_steps": _steps(client, run.info.run_id, "total_loss"),
            "map_history": [(m.step, m.value)
                            for m in client.get_metric_history(run.info.run_id, "SyntheticReIDTiny/mAP")]}


def _metrics_json(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.json"))]


@needs_mlflow
@pytest.mark.slow
def test_training_run_logs_params_metrics_artifacts_and_status(trained):
    run, out = trained["run"], trained["out"]
    params = run.data.params
    assert params["SOLVER.MAX_EPOCH"] == "1" and params["MODEL.BACKBONE.WIDTH_MULT"] == "0.25"
    assert params["DATASETS.TESTS"] == "('SyntheticReIDTiny',)" and params["MLFLOW.EXPERIMENT"] == "training"
    assert len(params) > 100  # more than one log_batch call's worth
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny_run"
    # The default store keeps everything in OUTPUT_DIR/mlruns (MLflow's own default is relative to the cwd).
    assert run.info.artifact_uri.startswith(Path(out, "mlruns", "mlartifacts").as_uri() + "/")
    records = _metrics_json(out)
    assert trained["loss_steps"] == [r["iteration"] for r in records if "total_loss" in r]
    final = [r for r in records if "SyntheticReIDTiny/mAP" in r]
    assert final and len(trained["loss_steps"]) >= 2  # an evaluation ran, losses were written more than once
    assert trained["map_history"] == [(r["iteration"], pytest.approx(r["SyntheticReIDTiny/mAP"])) for r in final]
    expected = {"config.yaml", "metrics.json", "log.txt", "summary.txt"}
    if importlib.util.find_spec("matplotlib") is not None:
        expected.add("ranks.png")
    assert expected <= set(trained["artifacts"]), trained["artifacts"]


@needs_mlflow
@pytest.mark.slow
def test_resumed_training_continues_the_same_run(trained):
    from reid_engine.cli.train import main

    client, run_id = trained["client"], trained["run"].info.run_id
    args = list(trained["args"])
    args[args.index("SOLVER.MAX_EPOCH") + 1] = "2"  # the summary's continue command: --resume at twice the length
    assert main(["--resume"] + args) == 0
    assert read_run_record(str(trained["out"]))["run_id"] == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["SOLVER.MAX_EPOCH"] == "1"  # a param keeps its first value in MLflow
    steps = _steps(client, run_id, "total_loss")
    assert steps == sorted(set(steps)) and steps[:len(trained["loss_steps"])] == trained["loss_steps"]
    assert len(steps) > len(trained["loss_steps"])
    assert len(client.search_runs([run.info.experiment_id])) == 1
