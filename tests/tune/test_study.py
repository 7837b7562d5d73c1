"""The study of reid-tune: exactly N trials (slots), workers sharing it, interrupted trials continued.

No training: a fake `run_trial` (tests/tune/_fake_worker.py) suggests the params, sleeps and
returns a value. Several workers are separate processes on one SQLite file.
"""
import json
import os
import subprocess
import sys
import time

import pytest

optuna = pytest.importorskip("optuna")

from optuna.trial import TrialState  # noqa: E402

from reid_engine.reliability.preemption import TrainingPreempted  # noqa: E402
from reid_engine.tune import study as tune_study  # noqa: E402
from reid_engine.tune.space import Objective, ParamSpec, SearchSpace  # noqa: E402
from reid_engine.tune.study import (  # noqa: E402
    build_pruner,
    claim_next_trial,
    default_storage_url,
    finished_trials,
    open_storage,
    open_study,
    study_progress,
    work_on_study,
)
from reid_engine.utils.errors import MissingPackageError, ReidUserError, UsageError  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402
from tests.tune._fake_worker import BASE_PARAMS, SPACE, fake_value, make_run_trial  # noqa: E402


def _worker_cmd(storage_url, tmp_path, *extra):
    return [sys.executable, "-m", "tests.tune._fake_worker", "--storage", storage_url, "--record",
            str(tmp_path / "record.jsonl"), "--out-dir", str(tmp_path / "out"), *map(str, extra)]


def start_worker(storage_url, tmp_path, *extra):
    """A fake worker process (see tests/tune/_fake_worker.py); its output is piped."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, OMP_NUM_THREADS="1")
    return subprocess.Popen(_worker_cmd(storage_url, tmp_path, *extra), cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_worker(proc, timeout=120):
    """(return code, the final JSON line or None, stderr) of a worker."""
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else None), err


def records(tmp_path):
    path = tmp_path / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_file(path, proc, timeout=60):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, f"the worker ended early: {proc.communicate()}"
        assert time.time() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.05)


def new_study(tmp_path, n_trials, name="s", heartbeat_s=1.0, seed=0, pruner="median", space=SPACE):
    storage = open_storage(default_storage_url(str(tmp_path / "study")), heartbeat_s=heartbeat_s)
    return open_study(storage, name, space, n_trials, seed, BASE_PARAMS, pruner)


def run_in_process(study, tmp_path, **kwargs):
    work_on_study(study, make_run_trial(str(tmp_path / "record.jsonl"), str(tmp_path / "out"), **kwargs), poll_s=0.05)


def test_slots_give_exactly_n_trials_the_first_with_the_base_params(tmp_path):
    study = new_study(tmp_path, 5)
    assert study.user_attrs["n_trials"] == 5 and study.user_attrs["params"] == SPACE.keys
    assert study.user_attrs["objective"] == {"metric": "SyntheticReIDTiny/mAP", "direction": "maximize"}
    run_in_process(study, tmp_path, fail_on_slot=3)

    trials = study.get_trials()
    assert len(trials) == 5 and len(finished_trials(trials)) == 5  # no trial created beyond the slots
    assert trials[0].params == BASE_PARAMS and trials[0].user_attrs["base"] is True
    assert [t.user_attrs["slot"] for t in trials] == [1, 2, 3, 4, 5]
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 4
    failed = trials[2]
    assert failed.state == TrialState.FAIL and failed.user_attrs["status"] == "failed"
    assert failed.user_attrs["error"] == "a fake failure with a second line"  # one line
    assert all(t.user_attrs["status"] == "complete" for t in trials if t.state == TrialState.COMPLETE)
    best = max((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert best.value == pytest.approx(fake_value(best.params))
    expected = f"5 of 5 trials finished (4 complete, 1 failed), 0 running, best #{best.number} {best.value:.4f}"
    assert study_progress(study) == expected

    run_in_process(study, tmp_path)  # a finished study: nothing more runs
    assert len(study.get_trials()) == 5 and len(records(tmp_path)) == 5


@pytest.mark.slow
def test_same_seed_and_history_sample_the_same_params(tmp_path):
    first = new_study(tmp_path / "a", 3, seed=3)
    run_in_process(first, tmp_path / "a")
    second = new_study(tmp_path / "b", 3, seed=3)
    run_in_process(second, tmp_path / "b")
    other = new_study(tmp_path / "c", 3, seed=4)
    run_in_process(other, tmp_path / "c")
    params = [[t.params for t in s.get_trials()] for s in (first, second, other)]
    assert params[0] == params[1]
    assert params[0][0] == params[2][0] == BASE_PARAMS  # the base slot is fixed
    assert not {p["SOLVER.BASE_LR"] for p in params[0][1:]} & {p["SOLVER.BASE_LR"] for p in params[2][1:]}
    assert len({t["SOLVER.BASE_LR"] for t in params[0]}) == 3  # reseeded per trial: no repeats


@pytest.mark.slow  # worker processes
def test_two_worker_processes_run_every_slot_once(tmp_path):
    url = default_storage_url(str(tmp_path / "study"))
    workers = [start_worker(url, tmp_path, "--n-trials", 8, "--sleep-s", 0.2, "--barrier", tmp_path / "barrier",
                            "--workers", 2) for _ in range(2)]
    results = [finish_worker(w) for w in workers]
    assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]

    ran = records(tmp_path)
    assert sorted(r["number"] for r in ran) == list(range(8))  # every slot once, none twice, none extra
    assert {r["pid"] for r in ran} == {w.pid for w in workers}  # both took part
    finals = [final for _, final, _ in results]
    assert all(f["progress"].startswith("8 of 8 trials finished (8 complete), 0 running") for f in finals)
    assert finals[0]["best"] == finals[1]["best"]  # both return only when all are done, and agree
    study = optuna.load_study(study_name="fake", storage=url)
    assert len(study.trials) == 8 and all(t.state == TrialState.COMPLETE for t in study.trials)


@pytest.mark.slow  # worker processes
def test_a_killed_workers_trial_goes_stale_and_is_continued(tmp_path):
    url = default_storage_url(str(tmp_path / "study"))
    marker = tmp_path / "claimed.json"
    doomed = start_worker(url, tmp_path, "--n-trials", 3, "--heartbeat-s", 1, "--hang-on-slot", 2, "--marker", marker)
    try:
        wait_for_file(marker, doomed)
    finally:
        doomed.kill()  # SIGKILL: no chance to tell the study anything
        doomed.communicate()
    hung = json.loads(marker.read_text())

    study = new_study(tmp_path, 3, name="fake")  # joins; heartbeat 1 s: stale after 3 s
    run_in_process(study, tmp_path)

    trials = study.get_trials()
    assert len(finished_trials(trials)) == 3
    interrupted = trials[hung["number"]]
    assert interrupted.state == TrialState.FAIL
    assert (interrupted.datetime_complete - interrupted.datetime_start).total_seconds() >= 3.0  # the grace period
    (continuation,) = [t for t in trials if t.user_attrs.get("resumes_trial") == hung["number"]]
    assert continuation.state == TrialState.COMPLETE and continuation.number == 3
    assert continuation.params == interrupted.params == hung["params"]
    assert continuation.user_attrs["output_dir"] == hung["output_dir"] and continuation.user_attrs["slot"] == 2
    assert study_progress(study).startswith("3 of 3 trials finished (3 complete), 0 running")


def test_preempted_trial_is_continued_and_the_stop_goes_on(tmp_path):
    study = new_study(tmp_path, 3)
    with pytest.raises(TrainingPreempted):  # the first attempt of slot 2
        run_in_process(study, tmp_path, preempt_on_slot=2, preempt_attempts=2)
    with pytest.raises(TrainingPreempted):  # its continuation, stopped too
        run_in_process(study, tmp_path, preempt_on_slot=2, preempt_attempts=2)
    run_in_process(study, tmp_path, preempt_on_slot=2, preempt_attempts=2)

    trials = study.get_trials()
    first, second, third = [t for t in trials if t.user_attrs["slot"] == 2]
    assert (first.number, second.number, third.number) == (1, 3, 4)
    assert first.state == second.state == TrialState.FAIL
    assert first.user_attrs["status"] == second.user_attrs["status"] == "preempted"
    assert second.user_attrs["resumes_trial"] == 1 and third.user_attrs["resumes_trial"] == 3  # the latest attempt
    assert third.state == TrialState.COMPLETE and third.params == first.params
    assert third.user_attrs["output_dir"] == first.user_attrs["output_dir"]
    assert second.intermediate_values == {1: 0.5, 2: 0.5}  # the evaluations before each stop are kept
    assert third.intermediate_values == {1: 0.5, 2: 0.5, 10: third.value} and len(finished_trials(trials)) == 3
    # the continuation was claimed before slot 3: it ran right after the stop
    assert [r["number"] for r in records(tmp_path)] == [0, 1, 3, 4, 2]


def test_an_unexpected_error_fails_the_trial_and_is_raised(tmp_path):
    study = new_study(tmp_path, 2)

    def broken(trial):
        raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        work_on_study(study, broken, poll_s=0.05)
    first = study.get_trials()[0]
    assert first.state == TrialState.FAIL and first.user_attrs["error"] == "ZeroDivisionError: a bug"
    assert len(study.get_trials()) == 2  # no continuation of a bug
    assert claim_next_trial(study).number == 1 and claim_next_trial(study) is None  # nothing left waiting


def test_a_complete_outcome_without_a_value_is_a_failure(tmp_path):
    study = new_study(tmp_path, 1)
    work_on_study(study, lambda trial: tune_study.TrialOutcome(TrialState.COMPLETE, float("nan")), poll_s=0.05)
    (trial,) = study.get_trials()
    assert trial.state == TrialState.FAIL and trial.user_attrs["error"] == "the objective value is nan"


def test_a_different_search_on_the_same_study_is_one_line(tmp_path):
    new_study(tmp_path, 5)
    with pytest.raises(UsageError) as info:
        new_study(tmp_path, 6)
    message = str(info.value)
    assert "\n" not in message and "study s has 5 trials over keys" in message and "asks for 6 trials" in message
    assert "another --study-name" in message
    other_space = SearchSpace(params=(ParamSpec("SOLVER.BASE_LR", "float", 1e-4, 1e-2, log=True),),
                              objective=Objective("SyntheticReIDTiny/mAP", "maximize"))
    with pytest.raises(UsageError, match="over keys SOLVER.BASE_LR \\(maximize") as info:
        new_study(tmp_path, 5, space=other_space)
    assert "\n" not in str(info.value)
    assert len(new_study(tmp_path, 5).get_trials()) == 5  # the same search joins, adding nothing


def test_a_study_that_never_became_ready_is_one_line(tmp_path, monkeypatch):
    storage = open_storage(default_storage_url(str(tmp_path)), heartbeat_s=1)
    optuna.create_study(study_name="half", storage=storage)  # as if its creator died before the slots
    monkeypatch.setattr(tune_study, "READY_TIMEOUT_S", 0.3)
    with pytest.raises(ReidUserError, match="creator never finished setting it up") as info:
        open_study(storage, "half", SPACE, 3, 0, BASE_PARAMS, "median")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("url, error, expected", [
    ("not a url", UsageError, "cannot read the study storage URL not a url (--storage)"),
    ("nosuchdb://h/x", UsageError, "unknown kind of database in the study storage URL nosuchdb://h/x"),
    ("mysql+pymysql://me:s3cret@localhost/x", MissingPackageError,
     "the study storage mysql+pymysql://me:***@localhost/x needs its database driver, which is not installed"),
    ("postgresql+psycopg://me:s3cret@/x?host=/nonexistent-dir&port=1", ReidUserError,
     "cannot open the study storage postgresql+psycopg://me:***@/x?host=/nonexistent-dir&port=1 (--storage): "),
])
def test_a_bad_storage_url_is_one_line_without_the_password(monkeypatch, url, error, expected):
    monkeypatch.setattr(tune_study, "OPEN_STORAGE_TRIES", 1)
    pytest.importorskip("psycopg")
    if url.startswith("mysql"):
        try:
            import pymysql  # noqa: F401
            pytest.skip("pymysql is installed: no missing driver to report")
        except ImportError:
            pass
    with pytest.raises(error) as info:
        open_storage(url)
    message = str(info.value)
    assert message.startswith(expected) and "\n" not in message and "s3cret" not in message


def test_pruners_by_name():
    assert isinstance(build_pruner("median"), optuna.pruners.MedianPruner)
    assert isinstance(build_pruner("hyperband"), optuna.pruners.HyperbandPruner)
    assert isinstance(build_pruner("none"), optuna.pruners.NopPruner)
    with pytest.raises(UsageError, match="unknown pruner 'asha' \\(--pruner\\): use one of median, hyperband, none"):
        build_pruner("asha")


def test_default_storage_is_sqlite_in_the_study_folder(tmp_path):
    assert default_storage_url(str(tmp_path / "x")) == f"sqlite:///{tmp_path}/x/study.db"
    open_storage(default_storage_url(str(tmp_path / "x" / "y")))  # creates its folder
    assert (tmp_path / "x" / "y" / "study.db").is_file()


def test_the_median_pruner_waits_for_two_complete_trials(tmp_path):
    study = new_study(tmp_path, 4, space=SearchSpace(params=(ParamSpec("SOLVER.BASE_LR", "float", 1e-4, 1e-2),),
                                                     objective=Objective("m", "maximize")))
    values = iter([0.9, 0.8, 0.1, 0.95])

    def run_trial(trial):
        trial.suggest_float("SOLVER.BASE_LR", 1e-4, 1e-2)
        trial.report(next(values), step=100)
        if trial.should_prune():
            return tune_study.TrialOutcome(TrialState.PRUNED)
        return tune_study.TrialOutcome(TrialState.COMPLETE, trial.study.get_trials()[trial.number].intermediate_values[100])

    work_on_study(study, run_trial, poll_s=0.05)
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED, TrialState.COMPLETE]
    assert study.get_trials()[2].user_attrs["status"] == "pruned"
    assert "4 of 4 trials finished (3 complete, 1 pruned)" in study_progress(study)


def test_progress_is_logged_per_trial(tmp_path, caplog):
    import logging

    study = new_study(tmp_path, 2)
    with caplog.at_level(logging.INFO):
        work_on_study(study, make_run_trial(str(tmp_path / "r.jsonl"), str(tmp_path / "out")), poll_s=0.05,
                      log=logging.getLogger("test.tune"))
    lines = [r.getMessage() for r in caplog.records if r.name == "test.tune"]
    assert lines[0] == "Trial #0 (slot 1 of 2) started: SOLVER.BASE_LR=0.00035 DATALOADER.NUM_INSTANCE=4"
    assert lines[1].startswith("Trial #0 complete: ") and "1 of 2 trials finished (1 complete), 0 running" in lines[1]
    assert "ETA 0:00:0" in lines[1]
    assert lines[2] == "Trial #1 (slot 2 of 2) started: params sampled when the run starts"
    assert lines[-1].startswith("Study s is done: 2 of 2 trials finished (2 complete)")
