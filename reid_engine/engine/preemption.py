"""Stop requests from the job's environment: SIGTERM, SIGUSR1 (what SLURM and Kubernetes
send before a kill) and SIGINT (Ctrl-C).

A first signal only records the request; the training loop (the
:class:`~reid_engine.engine.hooks.Preemption` hook) then finishes the current step, has
every worker agree on that step, saves a checkpoint and ends with
:class:`TrainingPreempted`, whose exit status is :data:`PREEMPTED_EXIT_CODE`. A second
signal stops the process at once (the signal's default action); the checkpoints on
disk stay intact because every file is written atomically.

A terminal's Ctrl-C reaches the launcher and every worker, and torchrun forwards the
signal it gets to its workers once more: a repeat of the same signal within
:data:`REPEAT_WINDOW_S` seconds counts as the same request. A signal to the process group
(Ctrl-C, a batch scheduler's cancel) also ends the data-loader workers; the training loop
then loads the batches left before the stop in the main process (``engine.loader_faults``).
"""
import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Dict

import torch
import torch.distributed as dist

from ..utils import comm
from ..utils.errors import ReidUserError

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "STOP_SIGNALS",
    "TrainingPreempted",
    "install_stop_handlers",
    "launcher_stop_handlers",
    "requested_signal",
    "set_external_stop_flag",
    "wait_for_request",
    "StopAgreement",
    "signal_name",
]

logger = logging.getLogger(__name__)

#: exit status of a run stopped by a signal after saving its checkpoint, whichever of the
#: three signals it was: 143 (128 + SIGTERM), the status Kubernetes and SLURM report for a
#: graceful SIGTERM, so one scheduler rule (requeue on 143) covers every preemption
PREEMPTED_EXIT_CODE = 143
#: the signals that ask for a checkpoint and a clean stop
STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None),
                                 getattr(signal, "SIGINT", None)) if s is not None)
#: seconds during which a repeat of the first signal counts as the same request
REPEAT_WINDOW_S = 1.0

_state: Dict[str, Any] = {"signal": None, "external": None}


class TrainingPreempted(ReidUserError):
    """Training stopped on a signal after saving a checkpoint; resume with ``--resume``."""

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(self, message: str, signum: int = 0, iteration: int = -1, checkpoint: str = ""):
        super().__init__(message)
        self.signum, self.iteration, self.checkpoint = signum, iteration, checkpoint

    def __reduce__(self):  # keep the fields when the exception crosses a process boundary
        return type(self), (str(self), self.signum, self.iteration, self.checkpoint)

    @classmethod
    def stopped(cls, signum: int, iteration: int, checkpoint: str, resume: str = "--resume") -> "TrainingPreempted":
        """The error for a run stopped by `signum` after `iteration` with `checkpoint` saved;
        `resume` says how to continue (the flag, or the whole command).

        An empty `checkpoint` means none could be saved at the stop (a step or hook could not
        finish without its data-loader workers): `iteration` is then the one interrupted, and
        the run continues from the last checkpoint on disk."""
        if not checkpoint:
            return cls(f"training stopped by {signal_name(signum)} during iteration {iteration}, which could not "
                       "finish without its data-loader workers (stopped by the same signal): no new checkpoint; "
                       f"continue from the last one in OUTPUT_DIR with {resume}", signum, iteration, checkpoint)
        return cls(f"training stopped by {signal_name(signum)} after iteration {iteration}: checkpoint {checkpoint} "
                   f"saved; continue with {resume}", signum, iteration, checkpoint)


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15, etc. (the number when unknown)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _install_handlers(on_first: Callable[[int], None], on_second: Callable[[], None]) -> Callable[[], None]:
    """Handle STOP_SIGNALS: the first calls ``on_first(signum)``; a repeat of it within
    :data:`REPEAT_WINDOW_S` is the same request (a terminal's process group, a launcher
    forwarding it); any later one calls ``on_second()`` and ends this process with the
    signal's default action. Main thread only.

    Returns:
        a function that puts the previous handlers back.
    """
    first: Dict[str, Any] = {"signal": None, "time": 0.0}

    def handler(signum: int, frame: Any) -> None:
        now = time.monotonic()
        if first["signal"] is None:
            first["signal"], first["time"] = signum, now
            on_first(signum)
        elif not (signum == first["signal"] and now - first["time"] < REPEAT_WINDOW_S):
            on_second()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)

    return restore


def install_stop_handlers() -> Callable[[], None]:
    """Record SIGTERM / SIGUSR1 / SIGINT as stop requests instead of dying at once.

    Only the main thread of a process can install signal handlers; elsewhere nothing is
    installed (logged) and the returned function does nothing.

    Returns:
        a function that puts the previous handlers back and forgets the request.
    """
    if threading.current_thread() is not threading.main_thread():
        logger.info("Not in the main thread: SIGTERM / SIGUSR1 / SIGINT keep their handlers (no checkpoint on preemption)")
        return lambda: None
    _state["signal"] = None
    restore_handlers = _install_handlers(lambda signum: _state.update(signal=signum), on_second=lambda: None)

    def restore() -> None:
        restore_handlers()
        _state["signal"] = None

    return restore


def set_external_stop_flag(flag: Any) -> None:
    """Also stop when ``flag.value`` is non-zero (a signal number): the launcher's shared
    value, set when the launcher itself is signalled (e.g. Kubernetes signals only PID 1).

    Args:
        flag: a ``multiprocessing.Value("i")`` shared with the launcher, or None.
    """
    _state["external"] = flag


def requested_signal() -> int:
    """The signal number of a pending stop request of this process, or 0."""
    if _state["signal"] is not None:
        return int(_state["signal"])
    flag = _state["external"]
    return int(flag.value) if flag is not None else 0


def wait_for_request(timeout_s: float) -> int:
    """The pending stop request, waiting up to `timeout_s` seconds for one to arrive.

    A signal to a process group reaches its processes in no defined order: a data-loader
    worker may die of it before this process has run its own handler.

    Returns:
        the signal number, or 0 when none arrived in time.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        signum = requested_signal()
        if signum or time.monotonic() >= deadline:
            return signum
        time.sleep(0.01)  # the handler runs in this (main) thread between sleeps


class StopAgreement:
    """Every worker's stop requests combined, one step behind and without waiting.

    After each step every worker starts one all-reduce (max) of one integer over the CPU
    (gloo) group and does not wait for it: the result is read after the next step, when it
    has long arrived. All workers therefore agree on the same iteration, one step after the
    signal, and a step never waits on the others for it. In a single-process run nothing is
    exchanged and the answer is immediate.
    """

    def __init__(self):
        self._work = None
        self._flag = None

    def exchange(self, local_signal: int) -> int:
        """Post this worker's request and return the agreed one of the step before.

        All workers must call this once after every step.

        Args:
            local_signal: this worker's request (a signal number, 0 for none).
        Returns:
            the largest signal number any worker had requested one step earlier (the
            request itself in a single-process run); 0: nobody asked to stop.
        """
        if comm.get_world_size() == 1:
            return int(local_signal)
        agreed = self.finish()
        self._flag = torch.tensor([int(local_signal)], dtype=torch.int32)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=comm.object_collective_group(),
                                     async_op=True)
        return agreed

    def finish(self) -> int:
        """Wait for the request in flight (every worker must call this, e.g. when training ends).

        Returns:
            the agreed signal number of that request (0 when none was in flight).
        """
        if self._work is None:
            return 0
        self._work.wait()
        self._work = None
        return int(self._flag.item())


def launcher_stop_handlers(flag: Any, on_second: Callable[[], None]) -> Callable[[], None]:
    """In the launcher of spawned workers: a first signal sets `flag` (the workers then
    save and stop), a different or later second one calls `on_second` (stop the workers
    now), then ends this process with the signal's default action.

    Returns:
        a function that puts the previous handlers back.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_first(signum: int) -> None:
        flag.value = int(signum)
        logger.warning("Received %s: the workers save a checkpoint after their current step and stop "
                       "(send it again to stop at once)", signal_name(signum))

    return _install_handlers(on_first, on_second)
