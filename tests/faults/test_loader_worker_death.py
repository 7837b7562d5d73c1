"""A data-loader worker killed mid-run (the OOM killer sends SIGKILL) ends the run in one line naming the
worker, the signal, the likely cause and what to lower; never a hang, and the checkpoints stay intact."""
import os
import re
import signal

import pytest
import torch

from tests.faults._jobs import error_lines, finish, job_args, read, start, wait_for


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"), reason="needs Linux /proc")
def test_sigkilled_loader_worker_is_one_line_and_keeps_the_checkpoint(data_root, tmp_path):
    out = str(tmp_path / "out")
    # 6 epochs: long enough that the run is still going when the worker dies (it ends there)
    proc = start(job_args(data_root, out, "DATALOADER.NUM_WORKERS", "2", "SOLVER.MAX_EPOCH", "6"),
                 REID_TEST_STEP_DELAY=0.1)
    checkpoint = os.path.join(out, "model_0000008.pth")
    wait_for(lambda: os.path.exists(checkpoint) or proc.poll() is not None, what="the first checkpoint")
    workers = _children(proc.pid)
    assert len(workers) == 2, workers  # the two loader workers
    os.kill(workers[0], signal.SIGKILL)
    rc, _, err = finish(proc, timeout=120)
    assert rc == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (line,) = error_lines(err)
    assert f"data-loader worker (pid {workers[0]}) was killed by SIGKILL" in line
    assert "out-of-memory killer" in line and "DATALOADER.NUM_WORKERS" in line and "--resume" in line
    # The checkpoints written before the worker died are intact (normally just the one of iteration 8).
    name = read(os.path.join(out, "last_checkpoint")).strip()
    assert re.fullmatch(r"model_\d{7}\.pth", name), name
    assert torch.load(os.path.join(out, name), weights_only=True)["iteration"] == int(name[6:13])
    assert torch.load(checkpoint, weights_only=True)["iteration"] == 8
