"""`reid-train` builds and checks its config once per process: the launching one; workers receive it."""
import os
import subprocess
import sys

import pytest

from reid_engine.cli import train
from reid_engine.config import CfgNode
from reid_engine.engine import setup as engine_setup

JOB_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_train_job.py")
# Guard against hangs only: starting two torch workers on a busy 2-core machine can take a minute.
JOB_TIMEOUT_S = 240


@pytest.fixture()
def calls(monkeypatch):
    """Names of the config builder / checker calls, in order; the evaluation records the config it gets."""
    seen = []
    for module, name in ((train, "build_config"), (train, "check_config_values"),
                         (engine_setup, "check_config_values")):
        original = getattr(module, name)

        def counting(*args, _name=name, _original=original, **kwargs):
            seen.append(_name)
            return _original(*args, **kwargs)
        monkeypatch.setattr(module, name, counting)
    monkeypatch.setattr(train, "_eval_only", lambda cfg: seen.append(cfg))  # stands in for the evaluation
    return seen


def _check_built_once(seen):
    assert seen[:2] == ["build_config", "check_config_values"] and len(seen) == 3, seen
    assert isinstance(seen[2], CfgNode) and seen[2].is_frozen()


def test_one_worker_run_builds_and_checks_its_config_once(calls, tmp_path):
    assert train.main(["--eval-only", "MODEL.DEVICE", "cpu", "OUTPUT_DIR", str(tmp_path)]) == 0
    _check_built_once(calls)


def test_worker_called_directly_builds_and_checks_the_config_itself(calls, tmp_path):
    args = train.build_parser().parse_args(["--eval-only", "MODEL.DEVICE", "cpu", "OUTPUT_DIR", str(tmp_path)])
    train.train_worker(args)
    _check_built_once(calls)


@pytest.mark.slow
def test_spawned_workers_receive_the_config_and_build_nothing(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, JOB_SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [line.split(" ", 1) for line in (tmp_path / "calls.txt").read_text().splitlines()]
    (launcher,) = [pid for pid, what in records if what == "launcher"]
    config_work = sorted((pid, what) for pid, what in records if what in ("build_config", "check_config_values"))
    assert config_work == [(launcher, "build_config"), (launcher, "check_config_values")]
    workers = sorted((what, pid) for pid, what in records if what.startswith("worker"))
    assert [what for what, _ in workers] == [f"worker CfgNode frozen=True rank={rank}" for rank in (0, 1)]
    assert launcher not in {pid for _, pid in workers}
