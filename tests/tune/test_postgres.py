"""Two real `reid-tune` workers on one study of a real PostgreSQL server (tests/tune/_postgres.py starts one),
one of them killed with kill -9 mid-trial: Optuna's heartbeats find its trial stale, its retry continues
from the trial's own checkpoint, and the final weights are those of the same trial trained without
interruption (the in-process test_study.py proves the wait for a trial running elsewhere).
"""
import os
import signal
import subprocess
import sys
import time

import pytest

optuna = pytest.importorskip("optuna")
pytestmark = pytest.mark.slow  # a server and worker processes: half a minute

from optuna.trial import TrialState  # noqa: E402

from reid_engine.tune.study import finished_trials, retried_from  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402
from tests.tune._postgres import postgres_server, postgres_url  # noqa: E402,F401
from tests.tune.conftest import BASE_LR, CFG, SPACE, assert_same_weights, continued_opts, weights  # noqa: E402


def _tune_worker(args, log_path):
    """`python tools/tune_net.py args` in the background, its output (stdout and stderr) into `log_path`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "tools", "tune_net.py"), *args], cwd=REPO_ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    log.close()  # the child has its own copy
    return proc


def _wait(predicate, procs, timeout, what):
    deadline = time.time() + timeout
    while not predicate():
        for proc in procs:
            assert proc.poll() is None, f"a worker ended (status {proc.returncode}) before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_two_reid_tune_workers_one_killed_mid_trial(postgres_url, data_root, tmp_path,  # noqa: F811
                                                    uninterrupted_first_trial):
    """Two `reid-tune` workers on one PostgreSQL study of 3 tiny trials; the one running trial #0 is SIGKILLed
    after the trial's first checkpoint: the other worker runs the rest (trial #0 silent for its grace period,
    3 x --heartbeat 2 s, meanwhile) and continues it from that checkpoint. Every slot ends COMPLETE, exactly 3."""
    space_file = tmp_path / "lr.yml"
    space_file.write_text(SPACE)
    out = tmp_path / "out"
    args = ["--config-file", CFG, "--search-space", str(space_file), "--n-trials", "3", "--storage", postgres_url,
            "--study-name", "e2e", "--heartbeat", "2", *continued_opts(data_root, out)]
    logs = [tmp_path / "worker0.log", tmp_path / "worker1.log"]
    workers = [_tune_worker(args, log) for log in logs]
    trial0 = out / "e2e" / "trials" / "trial_0000"
    try:
        def owner_of_trial0():
            return [i for i, log in enumerate(logs) if "Trial #0 started" in log.read_text()]

        _wait(lambda: owner_of_trial0() and (trial0 / "last_checkpoint").exists(), workers, 600,
              "trial #0's first checkpoint")
        (doomed,) = owner_of_trial0()
        workers[doomed].kill()  # SIGKILL: its trial stays RUNNING until its heartbeat goes stale
        assert workers[doomed].wait(timeout=60) == -signal.SIGKILL
        survivor = workers[1 - doomed]
        assert survivor.wait(timeout=600) == 0, logs[1 - doomed].read_text()[-4000:]
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    study = optuna.load_study(study_name="e2e", storage=postgres_url)
    trials = study.get_trials()
    finished = finished_trials(trials)
    assert len(finished) == 3 and all(t.state == TrialState.COMPLETE for t in finished)
    first = trials[0]
    assert first.state == TrialState.FAIL  # the killed attempt
    (continuation,) = [t for t in trials if retried_from(t) == 0]
    assert continuation.params == first.params and continuation.user_attrs["output_dir"] == str(trial0)
    assert continuation.user_attrs["iterations"] == 36  # 4 epochs of 9, each counted once
    trial_log = (trial0 / "log.txt").read_text()
    assert "Resuming from" in trial_log and "Starting training from iteration 0" in trial_log
    resumed_at = [line for line in trial_log.splitlines() if "Starting training from iteration" in line][-1]
    assert not resumed_at.endswith("iteration 0"), resumed_at  # the continuation started after the checkpoint
    survivor_log = logs[1 - doomed].read_text()
    assert f"Trial #{continuation.number} started, continuing #0" in survivor_log
    # The continued trial ends with the weights of the same trial trained without interruption (the base
    # config's values, seed 0): resume after a kill -9 is exact too.
    assert first.params == {"SOLVER.BASE_LR": BASE_LR} and first.user_attrs["seed"] == 0
    assert_same_weights(weights(trial0 / "model_final.pth"), uninterrupted_first_trial)
