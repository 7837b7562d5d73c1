"""Data-loader worker processes that die during training: a clear error, or part of a stop.

torch's DataLoader notices a dead worker itself: its SIGCHLD handler, or its periodic
liveness check while it waits for a batch, raises ``RuntimeError("DataLoader worker
(pid 123) is killed by signal: Killed. ...")``. The training loop turns that into
:class:`DataLoaderWorkerDied`, one line naming the worker, the signal, the likely cause
and what to lower.

A stop signal sent to the whole process group (Ctrl-C in a terminal, a batch scheduler's
cancel) reaches the workers too, and SIGTERM kills them. That is no failure when this
process got the signal as well: :func:`watch_loader_workers` keeps such a death from
being raised in the middle of a step (torch's handler raises wherever the main thread
is), and the loop either loads the batches left before the stop in the main process
(:func:`load_in_main_process`) and saves its checkpoint at the agreed step, or stops
from the last checkpoint when a hook's own loader died.
"""
import re
import signal
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Tuple

from ..utils.errors import ReidUserError
from .preemption import STOP_SIGNALS, requested_signal

__all__ = ["DataLoaderWorkerDied", "STOP_GRACE_S", "loader_worker_error", "load_in_main_process", "raise_pending_stop_death",
           "stopped_worker", "watch_loader_workers"]

_KILLED = re.compile(r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: (?P<signal>[^.]+)\.")
_EXITED = re.compile(r"DataLoader worker \(pid\(s\) (?P<pids>[\d, ]+)\) exited unexpectedly")
_LOWER = "lower DATALOADER.NUM_WORKERS, SOLVER.IMS_PER_BATCH or INPUT.SIZE_TRAIN"
_STOP_SIGNAL_NAMES = frozenset(signal.Signals(s).name for s in STOP_SIGNALS)
#: seconds a worker's death that a stop signal explains waits for this process's own signal:
#: a signal to a process group reaches its members in no defined order
STOP_GRACE_S = 1.0

# A worker death by a stop signal that the watch kept from being raised mid-step; "active":
# the watch is installed, so such deaths reach the loop only where a batch is fetched;
# "in_main": the training batches are loaded in the main process since such a death.
_watch: Dict[str, Any] = {"death": None, "active": False, "in_main": False}


class DataLoaderWorkerDied(ReidUserError, RuntimeError):
    """A data-loader worker process died during training."""


def _signal_by_description(text: str) -> str:
    """The signal name (SIGKILL) for its description (Killed), as strsignal() words it."""
    for sig in signal.Signals:
        if signal.strsignal(sig) == text:
            return sig.name
    return text


def _killed_by(exc: BaseException) -> Optional[str]:
    """The signal name in a "worker is killed by signal" error, or None."""
    killed = _KILLED.search(str(exc)) if isinstance(exc, RuntimeError) else None
    return _signal_by_description(killed.group("signal").strip()) if killed else None


def _exited_by_signal(exc: BaseException) -> Optional[Tuple[str, str]]:
    """(pid, signal name) of the worker an "exited unexpectedly" error names, when it was one
    worker ended by a signal, else None.

    torch raises that error from its own liveness check, which reaps the dead worker first, so
    its SIGCHLD handler can no longer tell the signal (which of the two reports a death is a
    race); the worker objects it checked, with their exit codes, are in that frame.
    """
    frame = _fetch_wait_frame(_traceback_frames(exc))
    failed = (frame.f_locals.get("failed_workers") or []) if frame is not None else []
    code = getattr(failed[0], "exitcode", None) if len(failed) == 1 else None
    if isinstance(code, int) and code < 0:
        return str(failed[0].pid), signal.Signals(-code).name
    return None


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
    by_signal = None if killed else _exited_by_signal(exc)
    if killed or by_signal:
        pid, name = (killed.group("pid"), _killed_by(exc)) if killed else by_signal
        worker = f"data-loader worker (pid {pid}) was killed by {name}"
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


class _WorkerExitedOnStop(RuntimeError):
    """A worker process exited while a stop was requested (a spawned worker ends itself on
    SIGINT): noted by the watch, raised before the next fetch."""


def _fetch_wait_code() -> Any:
    """The code of torch's wait for a batch from the workers (None if torch changed it)."""
    try:
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
        return _MultiProcessingDataLoaderIter._try_get_data.__code__
    except (ImportError, AttributeError):
        return None


def _fetch_wait_frame(frames: Iterable[Any]) -> Any:
    """The first of `frames` that is torch's wait for a batch from the workers, or None."""
    wait_code = _fetch_wait_code()
    return next((frame for frame in frames if frame.f_code is wait_code), None) if wait_code is not None else None


def _in_fetch_wait(frames: Iterable[Any]) -> bool:
    """Whether one of `frames` is torch's wait for a batch from the workers."""
    return _fetch_wait_frame(frames) is not None


def _frames_up(frame: Any, limit: int = 32) -> Iterator[Any]:
    """`frame` and its callers (the wait for a batch is a few calls deep: queue, connection, select)."""
    while frame is not None and limit > 0:
        yield frame
        frame, limit = frame.f_back, limit - 1


def _traceback_frames(exc: BaseException) -> Iterator[Any]:
    """The frames `exc` passed through, from where it was caught to where it was raised."""
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def stopped_worker(exc: BaseException) -> bool:
    """Whether `exc` may come from data-loader workers a stop signal ended, and was raised
    where a batch is fetched, so that fetching the batch otherwise is safe.

    That is a worker killed by SIGTERM / SIGINT / SIGUSR1 while :func:`watch_loader_workers`
    is active (it raises those only at a fetch), a worker that exited during a stop (noted
    by the watch), or any error raised inside torch's wait for a batch: "exited unexpectedly",
    or a batch a dead worker had queued that can no longer be received (FileNotFoundError,
    ConnectionRefusedError). A worker killed by anything else (SIGKILL: the out-of-memory
    killer) is not.
    """
    if isinstance(exc, _WorkerExitedOnStop):
        return True
    if isinstance(exc, ReidUserError) or not isinstance(exc, Exception):
        return False
    name = _killed_by(exc)
    if name is not None and name not in _STOP_SIGNAL_NAMES:
        return False
    return (name is not None and _watch["active"]) or _in_fetch_wait(_traceback_frames(exc))


def watch_loader_workers() -> Callable[[], None]:
    """While training: keep a data-loader worker's death by a stop signal from being raised
    wherever the main thread happens to be (mid-step, mid-save), as torch's SIGCHLD handler
    does. Such a death, and a worker's exit while a stop is requested, are raised at once
    only while the main thread waits for a batch, and otherwise by
    :func:`raise_pending_stop_death` before the next fetch. Any other death (SIGKILL by the
    out-of-memory killer, a crash) is raised at once as before.

    Only the main thread of a process can change signal handlers; elsewhere (and where
    torch's handler cannot be found) nothing changes.

    Returns:
        a function that puts torch's handler back and forgets a death not raised yet.
    """
    try:
        from torch.utils.data._utils import signal_handling
        install_torch_handler = signal_handling._set_SIGCHLD_handler
    except (ImportError, AttributeError):
        return lambda: None
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        return lambda: None
    # torch installs its handler once per process, with its first worker processes; installed
    # now, it stays below this one (torch would otherwise install it above, at the first batch).
    install_torch_handler()
    torch_handler = signal.getsignal(signal.SIGCHLD)

    def handler(signum: int, frame: Any) -> None:
        try:
            if callable(torch_handler):
                torch_handler(signum, frame)
        except RuntimeError as e:
            if _killed_by(e) not in _STOP_SIGNAL_NAMES:
                raise
            death = e
        else:
            if not requested_signal():
                return  # a worker shut down as asked, or another child
            death = _WorkerExitedOnStop("a data-loader worker exited after a stop signal")
        if _in_fetch_wait(_frames_up(frame)):  # the fetch fails here, as it would by itself
            raise death
        if not _watch["in_main"]:  # else the training batches no longer come from workers
            _watch["death"] = death

    signal.signal(signal.SIGCHLD, handler)
    _watch.update(death=None, active=True, in_main=False)

    def restore() -> None:
        signal.signal(signal.SIGCHLD, torch_handler)
        _watch.update(death=None, active=False, in_main=False)

    return restore


def raise_pending_stop_death() -> None:
    """Raise the worker death by a stop signal (or exit during a stop) that
    :func:`watch_loader_workers` noted since the last fetch (call it where a fetch would
    fail: before a step)."""
    death, _watch["death"] = _watch["death"], None
    if death is not None:
        raise death


def load_in_main_process(trainer: Any) -> bool:
    """Load the training batches left before a stop in the main process: the workers are
    gone, and new ones would take long to start (seconds: a spawned worker imports torch)
    for the one or two steps until the workers agree on the step to save at. The batches
    are the same (nothing random depends on the worker).

    Closes the dead workers, puts the stream back where the steps left it (a batch a device
    prefetcher held ahead included) and makes the next step iterate it afresh.

    Args:
        trainer: a trainer with ``data_loader`` and ``restart_data_stream()`` (SimpleTrainer,
            DefaultTrainer); a resumable loader (``state_dict``) continues exactly.
    Returns:
        False when the trainer cannot restart its data stream.
    """
    restart = getattr(trainer, "restart_data_stream", None)
    if restart is None:
        return False
    loader = getattr(trainer, "data_loader", None)
    inner = getattr(loader, "loader", loader)  # the TrainLoader under a DevicePrefetcher
    resumable = hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict")
    state = loader.state_dict() if resumable else None
    close = getattr(inner, "close", None)
    if callable(close):
        close()
    if hasattr(inner, "num_workers"):
        inner.num_workers = 0
    _watch.update(death=None, in_main=True)  # the other workers' deaths no longer matter
    if state is not None:
        loader.load_state_dict(state)
    restart()
    return True
