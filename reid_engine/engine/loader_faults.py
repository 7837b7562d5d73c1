"""A data-loader worker process that died (OOM killer, a signal, a crash) as one clear error.

torch's DataLoader notices a dead worker itself: its SIGCHLD handler, or its periodic
liveness check while it waits for a batch, raises ``RuntimeError("DataLoader worker
(pid 123) is killed by signal: Killed. ...")``. The training loop turns that into
:class:`DataLoaderWorkerDied`, one line naming the worker, the signal, the likely cause
and what to lower.
"""
import re
import signal
from typing import Optional

from ..utils.errors import ReidUserError

__all__ = ["DataLoaderWorkerDied", "loader_worker_error"]

_KILLED = re.compile(r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: (?P<signal>[^.]+)\.")
_EXITED = re.compile(r"DataLoader worker \(pid\(s\) (?P<pids>[\d, ]+)\) exited unexpectedly")
_LOWER = "lower DATALOADER.NUM_WORKERS, SOLVER.IMS_PER_BATCH or INPUT.SIZE_TRAIN"


class DataLoaderWorkerDied(ReidUserError, RuntimeError):
    """A data-loader worker process died during training."""


def _signal_by_description(text: str) -> str:
    """The signal name (SIGKILL) for its description (Killed), as strsignal() words it."""
    for sig in signal.Signals:
        if signal.strsignal(sig) == text:
            return sig.name
    return text


def loader_worker_error(exc: BaseException, iteration: int) -> Optional[DataLoaderWorkerDied]:
    """The one-line error for a DataLoader's dead-worker RuntimeError, or None for any other error.

    Args:
        exc: the exception the training loop caught.
        iteration: the iteration it was caught in.
    Returns:
        a DataLoaderWorkerDied to raise instead, or None.
    """
    if not isinstance(exc, RuntimeError) or isinstance(exc, ReidUserError):
        return None
    text = str(exc)
    killed = _KILLED.search(text)
    if killed:
        name = _signal_by_description(killed.group("signal").strip())
        worker = f"data-loader worker (pid {killed.group('pid')}) was killed by {name}"
        if name == "SIGKILL":
            cause = "most likely by the out-of-memory killer (see `dmesg`, or the job's memory limit)"
        else:
            cause = "by a signal from outside or a crash of the image decoding"
    else:
        exited = _EXITED.search(text)
        if not exited:
            return None
        worker = f"data-loader worker(s) (pid {exited.group('pids').strip()}) exited unexpectedly"
        cause = "probably out of memory or shared memory (/dev/shm)"
    return DataLoaderWorkerDied(f"{worker} at iteration {iteration}, {cause}: {_LOWER} and resume with --resume "
                                "(the checkpoints on disk are intact)")
