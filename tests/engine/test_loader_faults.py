"""reliability.loader_faults.loader_worker_error: a worker killed by a signal is named with its signal
whichever of torch's two checks notices the death first (its SIGCHLD handler, or its liveness
check while waiting for a batch, which reaps the worker before the handler can tell the signal)."""
import os
import signal
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from reid_engine.reliability.loader_faults import loader_worker_error


class _Slow(Dataset):
    """Items that take a while, so that the worker is busy (alive) when it is killed."""

    def __len__(self):
        return 1000

    def __getitem__(self, index):
        time.sleep(0.05)
        return torch.tensor(index)


@pytest.mark.skipif(not hasattr(signal, "SIGCHLD"), reason="POSIX signals")
def test_a_worker_reaped_by_torch_s_liveness_check_is_still_named_with_its_signal():
    # timeout: the wait for a batch runs torch's liveness check after 0.5 s (not its default 5 s)
    iterator = iter(DataLoader(_Slow(), batch_size=1, num_workers=1, multiprocessing_context="fork", timeout=0.5))
    next(iterator)  # the worker runs
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler must not see the death
    try:
        pid = iterator._workers[0].pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="exited unexpectedly") as caught:
            for _ in range(100):
                next(iterator)
    finally:
        signal.signal(signal.SIGCHLD, previous)
        iterator._shutdown_workers()
    error = loader_worker_error(caught.value, 7)
    assert error is not None
    assert f"data-loader worker (pid {pid}) was killed by SIGKILL at iteration 7" in str(error)
    assert "out-of-memory killer" in str(error)


def test_other_errors_are_not_worker_deaths():
    assert loader_worker_error(RuntimeError("CUDA out of memory"), 3) is None
    assert loader_worker_error(ValueError("DataLoader worker (pid(s) 12) exited unexpectedly"), 3) is None
    error = loader_worker_error(RuntimeError("DataLoader worker (pid(s) 12, 13) exited unexpectedly"), 3)
    assert "data-loader worker(s) (pid 12, 13) exited unexpectedly at iteration 3" in str(error)
