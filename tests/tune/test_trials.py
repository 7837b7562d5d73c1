"""Trials are real training runs: a 2-trial study end to end through `reid-tune`, pruning that stops a
run cleanly on every training worker, and SIGTERM mid-trial continued bit-exactly by the same command.

Tiny R18 runs on the synthetic test set (CPU, about a second of training each).
"""
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time
import weakref

import pytest
import yaml

optuna = pytest.importorskip("optuna")

from optuna.trial import TrialState  # noqa: E402

from reid_engine.cli import tune as tune_cli  # noqa: E402
from reid_engine.engine import hooks  # noqa: E402
from reid_engine.engine.trainer_base import TrainingStopped  # noqa: E402
from reid_engine.reliability.preemption import TrainingPreempted  # noqa: E402
from reid_engine.tune import study as tune_study  # noqa: E402
from reid_engine.tune import trial_run  # noqa: E402
from reid_engine.tune.trial_run import TrialReporter  # noqa: E402
from reid_engine.utils.errors import ReidUserError  # noqa: E402
from tests.conftest import REPO_ROOT, records_of  # noqa: E402
from tests.engine._engine_fixtures import make_trainer, one_torch_thread  # noqa: E402,F401
from tests.tune.conftest import BASE_LR, assert_same_weights, continued_opts, weights  # noqa: E402

CFG = os.path.join(REPO_ROOT, "tests", "e2e", "configs", "tiny_R18.yml")
METRIC = "SyntheticReIDTiny/mAP"
SPACE = f"""
objective: {{metric: {METRIC}, direction: maximize}}
pruner: none
params:
  SOLVER.BASE_LR: {{type: float, low: 1.0e-4, high: 1.0e-3, log: true}}
"""


def base_opts(data_root, out, *extra):
    """The tiny base config of every study here: quarter-width R18 at 32x16, 2 epochs of 9 iterations with an
    evaluation after each, no periodic checkpoint; then `extra`."""
    return ["DATASETS.ROOT", data_root, "OUTPUT_DIR", str(out), "MODEL.BACKBONE.WIDTH_MULT", "0.25",
            "INPUT.SIZE_TRAIN", "[32, 16]", "INPUT.SIZE_TEST", "[32, 16]", "SOLVER.MAX_EPOCH", "2",
            "TEST.EVAL_PERIOD", "1", "SOLVER.CHECKPOINT_PERIOD", "10", *extra]


def tune_args(space_file, data_root, out, *extra, n_trials=2):
    return ["--config-file", CFG, "--search-space", str(space_file), "--n-trials", str(n_trials),
            *base_opts(data_root, out, *extra)]


def write_space(folder, text=SPACE, name="lr.yml"):
    path = folder / name
    path.write_text(text)
    return path


def load(study_dir, name):
    return optuna.load_study(study_name=name, storage=tune_study.default_storage_url(str(study_dir)))


def read_json(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def two_trials(data_root, tmp_path_factory):
    """One 2-trial study through `reid-tune` in this process: (study folder, study, exit status, weak references
    to its trainers, the files open afterwards)."""
    root = tmp_path_factory.mktemp("tune3")
    space_file = write_space(root)
    trainers = []
    original_init = trial_run.TrialTrainer.__init__

    def tracking_init(self, *args, **kwargs):
        trainers.append(weakref.ref(self))
        original_init(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial_run.TrialTrainer, "__init__", tracking_init)
        # MLflow on: the trials become nested runs of the study's run (test_trials_are_nested_mlflow_runs)
        status = tune_cli.main(tune_args(space_file, data_root, root / "out", "MLFLOW.ENABLED", "True"))
    gc.collect()
    fds_after = [os.path.realpath(os.path.join("/proc/self/fd", fd)) for fd in os.listdir("/proc/self/fd")]
    study_dir = root / "out" / "lr"
    return study_dir, load(study_dir, "lr"), status, trainers, fds_after


@pytest.mark.slow
def test_trials_are_nested_mlflow_runs_of_the_study_run(two_trials):
    """MLFLOW.ENABLED in the base config: one parent run for the study (FINISHED, with the summary files), each
    trial a nested run in the same store (the study folder's) with its params and its evaluations by iteration."""
    mlflow = pytest.importorskip("mlflow")
    study_dir, study, _, _, _ = two_trials
    client = mlflow.tracking.MlflowClient(f"sqlite:///{study_dir / 'mlruns' / 'mlflow.db'}")
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.info.run_name == "lr"
    assert parent.data.params["objective"] == f"maximize {METRIC}" and "SOLVER.BASE_LR" in parent.data.params
    assert {a.path for a in client.list_artifacts(parent_id)} >= {"summary.md", "best_config.yaml"}
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    by_name = {run.info.run_name: run for run in children}
    assert sorted(by_name) == ["trial_0000", "trial_0001"]
    for trial in study.get_trials():
        run = by_name[f"trial_{trial.number:04d}"]
        assert run.info.status == "FINISHED"
        assert float(run.data.params["SOLVER.BASE_LR"]) == pytest.approx(trial.params["SOLVER.BASE_LR"])
        history = client.get_metric_history(run.info.run_id, METRIC)
        # The same evaluations (MLflow's steps are metrics.json's iteration index; Optuna's the iterations done).
        values = [m.value for m in sorted(history, key=lambda m: m.step)]
        assert values == pytest.approx([value for _, value in sorted(trial.intermediate_values.items())])
    best = yaml.safe_load((study_dir / "best_config.yaml").read_text())
    assert best["MLFLOW"]["PARENT_RUN_ID"] == ""  # training the best config starts a run of its own


@pytest.mark.slow
def test_study_runs_two_trials_end_to_end(two_trials):
    study_dir, study, status, _, _ = two_trials
    assert status == 0
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    lrs = [t.params["SOLVER.BASE_LR"] for t in trials]
    assert lrs[0] == pytest.approx(0.00035) and len(set(lrs)) == 2  # the base config first, then sampled
    for t in trials:
        # 2 epochs, one evaluation after each: reported at the iterations done (the last one = max_iter).
        steps = sorted(t.intermediate_values)
        assert len(steps) == 2 and steps[1] == 2 * steps[0], steps
        assert t.value == t.intermediate_values[steps[-1]]  # the objective: the last evaluation's metric
        assert t.user_attrs["iterations"] == steps[-1] and t.user_attrs["seed"] == 0
        assert t.user_attrs["status"] == "complete"
        out = t.user_attrs["output_dir"]
        assert out == str(study_dir / "trials" / f"trial_{t.number:04d}")
        record = read_json(os.path.join(out, "trial.json"))
        assert record["status"] == "complete" and record["value"] == t.value and record["trial"] == t.number
        assert record["params"] == t.params and record["seed"] == 0 and record["iterations"] == steps[-1]
        assert [s for s, _ in record["evaluations"]] == steps
        assert os.path.isfile(os.path.join(out, "model_final.pth"))
    for name in ("summary.md", "best_config.yaml", "study.db", "log.txt"):
        assert (study_dir / name).is_file(), name


@pytest.mark.slow
def test_each_trial_log_holds_only_its_own_trial(two_trials):
    study_dir, study, _, _, _ = two_trials
    trials = study.get_trials()
    for t in trials:
        log = open(os.path.join(t.user_attrs["output_dir"], "log.txt")).read()
        assert log.count("Starting training from iteration 0") == 1
        assert f"trial_{t.number:04d}" in log
        others = [f"trial_{o.number:04d}" for o in trials if o.number != t.number]
        assert not any(o in log for o in others), t.number
        assert " started: " not in log and " complete: " not in log  # the study's lines stay in the study log
        assert f"Trial #{t.number}: {METRIC} = " in log  # the reporter's, at each evaluation
        config = yaml.safe_load(open(os.path.join(t.user_attrs["output_dir"], "config.yaml")))
        assert config["SOLVER"]["BASE_LR"] == t.params["SOLVER.BASE_LR"] and config["SEED"] == 0
    study_log = (study_dir / "log.txt").read_text()
    assert all(f"Trial #{t.number} complete" in study_log for t in trials)
    assert "Starting training" not in study_log


@pytest.mark.slow
def test_trials_leave_nothing_behind(two_trials):
    _, _, _, trainers, fds_after = two_trials
    assert len(trainers) == 2
    assert all(ref() is None for ref in trainers)  # every trainer (model, loaders, optimizer) was freed
    # Open files: the study's log and database (and matplotlib's fonts), none per trial.
    assert not [path for path in fds_after if "trial_" in path], fds_after


@pytest.mark.slow
def test_a_pruned_trial_stops_early_and_cleanly_on_both_workers(data_root, tmp_path, monkeypatch):
    # The main training worker reports through the study's database, and the pruning decision reaches the
    # other worker, so both stop after the same iteration, an epoch early. Every mAP is below 101: the
    # threshold pruner prunes at the first periodic evaluation.
    monkeypatch.setattr(tune_study, "build_pruner", lambda name: optuna.pruners.ThresholdPruner(lower=101.0))
    space_file = write_space(tmp_path)
    args = tune_args(space_file, data_root, tmp_path / "out", "MODEL.DEVICE", "cpu", n_trials=1)
    assert tune_cli.main(["--num-gpus", "2", *args]) == 0
    study_dir = tmp_path / "out" / "lr"
    (trial,) = load(study_dir, "lr").get_trials()
    assert trial.state == TrialState.PRUNED and list(trial.intermediate_values) == [9]
    assert trial.user_attrs["status"] == "pruned" and trial.user_attrs["iterations"] == 9
    out = trial.user_attrs["output_dir"]
    record = read_json(os.path.join(out, "trial.json"))
    assert record["status"] == "pruned" and record["iterations"] == 9
    assert not os.path.exists(os.path.join(out, "model_final.pth"))
    for log in ("log.txt", "log.txt.rank1"):
        text = open(os.path.join(out, log)).read()
        stop = [line for line in text.splitlines() if "Training stopped at iteration" in line]
        assert len(stop) == 1 and " INFO: " in stop[0] and "iteration 8: trial pruned" in stop[0], (log, stop)
        assert "Traceback" not in text and " ERROR: " not in text, log
    assert "Trial #0 pruned" in (study_dir / "log.txt").read_text()


def _proc(tool, args):
    """tools/<tool> in a fresh interpreter, its output piped."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
    return subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "tools", tool), *args], cwd=REPO_ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigterm_mid_trial_then_same_command_continues_it_bit_exactly(data_root, tmp_path, uninterrupted_first_trial):
    space_file = write_space(tmp_path)
    # 4 epochs, one checkpoint per epoch: the signal comes after the first checkpoint, well before the end.
    args = ["--config-file", CFG, "--search-space", str(space_file), "--n-trials", "1",
            *continued_opts(data_root, tmp_path / "out")]
    trial_dir = tmp_path / "out" / "lr" / "trials" / "trial_0000"
    proc = _proc("tune_net.py", args)
    deadline = time.time() + 180
    while not (trial_dir / "last_checkpoint").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("reid-tune: error:")]
    assert len(errors) == 1 and "trial #0 stopped by SIGTERM" in errors[0], err[-3000:]
    assert "run the same reid-tune command again" in errors[0] and "continue trial #0" in errors[0]
    record = read_json(trial_dir / "trial.json")
    assert record["status"] == "preempted" and record["params"] == {"SOLVER.BASE_LR": BASE_LR}
    stopped_at = record["iterations"]

    resumed = _proc("tune_net.py", args)  # the same command again
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-3000:]
    first, second = load(tmp_path / "out" / "lr", "lr").get_trials()
    assert first.state == TrialState.FAIL and first.user_attrs["status"] == "preempted"
    assert first.user_attrs["iterations"] == stopped_at
    assert second.state == TrialState.COMPLETE and tune_study.retried_from(second) == 0
    assert second.params == first.params and second.user_attrs["output_dir"] == str(trial_dir)
    assert second.user_attrs["iterations"] == 36  # 4 epochs of 9: the iterations after the checkpoint once
    log = (trial_dir / "log.txt").read_text()
    assert f"Starting training from iteration {stopped_at}" in log  # resumed after its checkpoint
    assert read_json(trial_dir / "trial.json")["status"] == "complete"

    # The study's first trial is the base config itself (its LR, seed 0): the uninterrupted run's weights.
    assert record["seed"] == 0
    assert_same_weights(weights(trial_dir / "model_final.pth"), uninterrupted_first_trial)


@pytest.mark.slow
def test_a_trial_stopped_after_its_final_checkpoint_evaluates_it_when_continued(data_root, tmp_path, monkeypatch):
    """Stopped between its final checkpoint (and evaluation) and the recording of its result, as a kill -9 there
    would: the continuation has nothing left to train, so it evaluates that checkpoint and completes."""
    original = TrialReporter.after_train

    def stopped_before_the_result(self):
        if self.trainer.iter >= self.trainer.max_iter:  # after the final checkpoint and evaluation
            monkeypatch.setattr(TrialReporter, "after_train", original)  # only the first attempt
            raise TrainingPreempted("stopped before its result", iteration=self.trainer.max_iter - 1)
        original(self)

    monkeypatch.setattr(TrialReporter, "after_train", stopped_before_the_result)
    space_file = write_space(tmp_path)
    args = tune_args(space_file, data_root, tmp_path / "out", n_trials=1)
    assert tune_cli.main(args) == 143
    assert tune_cli.main(args) == 0  # the same command continues it
    first, retry = load(tmp_path / "out" / "lr", "lr").get_trials()
    assert first.state == TrialState.FAIL and retry.state == TrialState.COMPLETE
    assert tune_study.retried_from(retry) == 0 and retry.user_attrs["iterations"] == 18
    out = retry.user_attrs["output_dir"]
    log = open(os.path.join(out, "log.txt")).read()
    assert "nothing to train" not in log and "Starting training from iteration 18" in log
    evaluations = [line[METRIC] for line in map(json.loads, open(os.path.join(out, "metrics.json"))) if METRIC in line]
    assert retry.value == evaluations[-1] == evaluations[-2]  # the same weights evaluated again: the same mAP


# --------------------------------------------------------------------------- the pieces alone


class _FakeTrial:
    number = 7

    def __init__(self):
        self.reports = []

    def report(self, value, step):
        self.reports.append((step, value))

    def should_prune(self):
        return False


def _evaluation():
    """A stand-in evaluation hook: writes two flattened results after every step and after training."""
    def put(trainer):
        trainer.storage.put_scalars(**{"Test/mAP": 0.5, "Test/Rank-1": 0.7}, smoothing_hint=False)
    return hooks.CallbackHook(after_step=put, after_train=put)


def test_reporter_names_the_metrics_that_exist_when_the_objective_is_missing():
    trial = _FakeTrial()
    trainer = make_trainer()
    trainer.register_hooks([_evaluation(), TrialReporter(lambda: trial, "Test/mINP", eval_period=2)])
    with pytest.raises(ReidUserError) as info:
        trainer.train(0, 6)
    assert "'Test/mINP' is not among the evaluation results (Test/Rank-1, Test/mAP)" in str(info.value)
    assert trial.reports == []

    trial, trainer = _FakeTrial(), make_trainer()
    trainer.register_hooks([_evaluation(), TrialReporter(lambda: trial, "Test/mAP", eval_period=2)])
    trainer.train(0, 6)
    assert trial.reports == [(2, 0.5), (4, 0.5), (6, 0.5)]  # periodic, then the final one at max_iter


def test_reporter_reports_the_cut_short_evaluation_a_resumed_run_redoes_first():
    values = iter([0.25, 0.5, 0.75])

    def evaluate():
        return {"Test": {"mAP": next(values)}}

    evaluation = hooks.EvalHook(2, evaluate)
    evaluation.load_state_dict({"pending": 3})  # a stop cut the evaluation after iteration 4 short
    trial, trainer = _FakeTrial(), make_trainer()
    trainer.register_hooks([evaluation, TrialReporter(lambda: trial, "Test/mAP", eval_period=2, evaluation=evaluation)])
    trainer.train(4, 8)
    assert evaluation.redone == 3 and evaluation.pending is None
    assert trial.reports == [(4, 0.25), (6, 0.5), (8, 0.75)]  # the redone one, then as usual

    trial, trainer = _FakeTrial(), make_trainer()
    plain = hooks.EvalHook(2, lambda: {"Test": {"mAP": 0.5}})
    trainer.register_hooks([plain, TrialReporter(lambda: trial, "Test/mAP", eval_period=2, evaluation=plain)])
    trainer.train(4, 8)
    assert plain.redone is None and trial.reports == [(6, 0.5), (8, 0.5)]  # nothing pending, nothing extra


def test_an_intended_stop_is_one_info_line(caplog):
    class Enough(TrainingStopped):
        pass

    def stop(trainer):
        if trainer.iter == 2:
            raise Enough("enough for today", iteration=trainer.iter)

    ended = []
    trainer = make_trainer()
    trainer.register_hooks([hooks.CallbackHook(after_step=stop, after_train=lambda t: ended.append(t.iter))])
    with records_of(caplog, "reid_engine.engine.train_loop"), pytest.raises(Enough) as info:
        trainer.train(0, 6)
    assert info.value.iteration == 2 and ended == [2]
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "stopped" in r.getMessage()]
    assert lines == [(logging.INFO, "Training stopped at iteration 2: enough for today")]
    assert not any(r.exc_info for r in caplog.records)
