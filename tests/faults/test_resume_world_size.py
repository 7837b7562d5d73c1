"""--resume on another number of workers: a 2-worker gloo run stopped by SIGTERM and resumed on 1 worker
(under torchrun, as a restart with fewer nodes is: auto-resume) trains on the same images, augmented alike,
in the same order as the uninterrupted run, with its losses and weights up to float reduction order. Only one
worker is signalled: both stop after the same iteration (the real-process test of the workers' agreement).
(The sampler's rule for any other number of workers, more included: tests/data/test_samplers.py.)"""
import glob
import json
import os
import subprocess
import sys

import pytest
import torch

from reid_engine.reliability import preemption
from tests.conftest import REPO_ROOT
from tests.e2e.test_train_net import load_weights, metrics_by_iter
from tests.faults._jobs import MAX_ITER, error_lines, finish, job_args, job_env, read

SEEN_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_seen_job.py")
TORCHRUN_1 = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "1"]
# Every image's loss and gradient independent of the others in its worker's share, so that one global batch
# split over 1, 2 or 4 workers gives the same mean gradient: frozen BN statistics, no BN neck, and no triplet
# loss (the features it gathers from other workers carry no gradient back to them).
PER_IMAGE = ("MODEL.BACKBONE.NORM", "FrozenBN", "MODEL.HEADS.WITH_BNNECK", "False",
             "MODEL.LOSSES.NAME", '("CrossEntropyLoss",)')


def _start(data_root, out, *flags, launcher=(sys.executable,), **env):
    """Start `_seen_job.py` (recording the steps into `out`) behind `launcher`."""
    cmd = [*launcher, SEEN_JOB, *flags, *job_args(data_root, out, *PER_IMAGE)]
    return subprocess.Popen(cmd, env=job_env(REID_TEST_SEEN_DIR=out, **env), cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finished(proc, expected_rc=0):
    rc, _, err = finish(proc)
    assert rc == expected_rc, err[-4000:]
    return err


def _steps(out):
    """{iteration: (workers, image paths, image digests, mean loss)}, the workers' shares in rank order."""
    shares = {}
    for path in glob.glob(os.path.join(out, "seen.rank*.jsonl")):
        rank = int(path.rsplit("rank", 1)[1].split(".")[0])
        for line in open(path):
            record = json.loads(line)
            shares.setdefault(record["iter"], {})[rank] = record
    steps = {}
    for iteration, by_rank in shares.items():
        records = [by_rank[rank] for rank in sorted(by_rank)]
        assert {r["world"] for r in records} == {len(records)}, f"iteration {iteration}: missing shares"
        steps[iteration] = (len(records), sum((r["paths"] for r in records), []),
                            sum((r["pixels"] for r in records), []),
                            sum(r["losses"]["loss_cls"] for r in records) / len(records))
    return steps


@pytest.mark.slow
def test_two_workers_stopped_by_sigterm_resume_exactly_on_one(data_root, tmp_path):
    ref, out = str(tmp_path / "ref"), str(tmp_path / "out")
    two = ("--num-gpus", "2", "--dist-url", "auto")
    reference = _start(data_root, ref, *two)  # alongside the others: each run keeps about one core busy
    err = _finished(_start(data_root, out, *two, REID_TEST_SIGNAL_AT="1:3:SIGTERM"), preemption.PREEMPTED_EXIT_CODE)
    assert "training stopped by SIGTERM after iteration 4" in error_lines(err)[-1]
    # Only worker 1 was signalled (in iteration 3); the agreement, read one step later, stops both after 4.
    rank0, rank1 = read(os.path.join(out, "log.txt")), read(os.path.join(out, "log.txt.rank1"))
    assert "Received SIGTERM during iteration 3" in rank1 and "Received" not in rank0
    for log in (rank0, rank1):
        assert "Stopping after iteration 4 on every worker (SIGTERM)" in log
    assert read(os.path.join(out, "last_checkpoint")).strip() == "model_0000004.pth"
    on_one = _start(data_root, out, launcher=TORCHRUN_1)  # torchrun: auto-resume, world size from torchrun
    for proc in (on_one, reference):
        _finished(proc)

    expected = _steps(ref)
    assert sorted(expected) == list(range(MAX_ITER)) and {s[0] for s in expected.values()} == {2}
    checkpoint = load_weights(os.path.join(out, "model_0000004.pth"))
    final = load_weights(os.path.join(ref, "model_final.pth"))
    log = read(os.path.join(out, "log.txt"))
    assert "Resuming the data stream of 2 workers on 1: the same global batch of 16 images" in log
    assert "Starting training from iteration 5" in log
    steps = _steps(out)
    assert sorted(steps) == sorted(expected)
    for iteration, (world, paths, pixels, loss) in steps.items():
        assert world == (2 if iteration <= 4 else 1)
        # The same images, in the same order, augmented alike (pixel for pixel), as the uninterrupted run.
        assert (paths, pixels) == expected[iteration][1:3], f"iteration {iteration} on 1 worker"
        assert loss == pytest.approx(expected[iteration][3], rel=1e-5, abs=0)
    ref_metrics, got_metrics = metrics_by_iter(ref), metrics_by_iter(out)
    for iteration, values in ref_metrics.items():  # (the stopped run also wrote iteration 4's)
        assert got_metrics.get(iteration) == pytest.approx(values, rel=1e-5, abs=0), f"metrics of {iteration}"
    weights = load_weights(os.path.join(out, "model_final.pth"))
    moved = max(float((final[k] - checkpoint[k]).abs().max()) for k in final if final[k].is_floating_point())
    differ = max(float((final[k] - weights[k]).abs().max()) for k in final if final[k].is_floating_point())
    assert differ < 1e-5 < 1e-3 < moved, (differ, moved)  # float reduction order, not another run
    assert "Auto-resume (launched by torchelastic)" in log
    assert torch.load(os.path.join(out, "model_final.pth"), weights_only=True)["iteration"] == MAX_ITER - 1
