"""Real training processes for the fault tests: the tiniest CLI run, started in the background or to
the end, and the exactness checks of the resume tests (shared by test_preemption,
test_dist_timeout and test_loader_worker_death)."""
import os
import subprocess
import sys
import time

import torch

from tests.conftest import REPO_ROOT
from tests.e2e.test_train_net import load_weights, metrics_by_iter, tiny_args

#: the of tools/train_net.py with fault injection (see its docstring)
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_train_job.py")
# tiny_R18 at 1/8 width, no evaluation: 9 iterations per epoch in well under a second, 2 MB checkpoints
TINY = ("MODEL.BACKBONE.WIDTH_MULT", "0.125", "DATASETS.TESTS", "()", "SOLVER.MAX_EPOCH", "2")
#: iterations of a TINY run (2 epochs of 9); periodic checkpoints after iterations 8 and 17
MAX_ITER = 18


def job_args(data_root, out, *extra):
    """Command-line arguments of a TINY run into `out`."""
    return tiny_args(data_root, out, *TINY, *extra)


def job_env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start(args, launcher=(), **env):
    """Start `_train_job.py args` (behind `launcher`, e.g. torchrun) in the background; output merged."""
    cmd = list(launcher) + ([JOB] if launcher else [sys.executable, JOB]) + list(args)
    return subprocess.Popen(cmd, env=job_env(**env), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=240):
    """Wait for a started job: (return code, stdout, stderr)."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def run(args, launcher=(), **env):
    return finish(start(args, launcher, **env))


def wait_for(predicate, timeout=120, what="condition"):
    """Poll `predicate` until it holds (fails the test after `timeout` seconds)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read(path):
    return open(path).read() if os.path.exists(path) else ""


def error_lines(stderr):
    return [line for line in stderr.splitlines() if ": error: " in line]


def assert_same_run(ref_out, out):
    """Final weights bit-identical; every metric the reference wrote is the same in `out`."""
    ref, got = load_weights(os.path.join(ref_out, "model_final.pth")), load_weights(os.path.join(out, "model_final.pth"))
    assert ref.keys() == got.keys()
    for k in ref:
        assert torch.equal(ref[k], got[k]), f"{k} differs from the uninterrupted run"
    ref_metrics, got_metrics = metrics_by_iter(ref_out), metrics_by_iter(out)
    assert {it: got_metrics.get(it) for it in ref_metrics} == ref_metrics


def snapshot(folder):
    """{name: bytes} of the files directly in `folder`."""
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))
            if os.path.isfile(os.path.join(folder, n))}
