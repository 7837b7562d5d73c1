"""Stop requests from the job's environment: SIGTERM, SIGUSR1 (what SLURM and Kubernetes
send before a kill) and SIGINT (Ctrl-C).

A first signal only records the request; the training loop (the
:class:`~reid_engine.engine.hooks.Preemption` hook) then finishes the current step, has
every worker agree on that step, saves a checkpoint and ends with
:class:`TrainingPreempted`, whose exit status is :data:`PREEMPTED_EXIT_CODE`. A second
signal stops the process at once (the signal's default action); the checkpoints on
disk stay intact because every file is written atomically.

Some work may last minutes: compiling a step (inductor lowers a big model for minutes on a
GPU machine), recording CUDA graphs, an evaluation on a big gallery. Schedulers kill a job a
few seconds after their SIGTERM, so such work runs in an *interruptible region*
(:func:`interruptible`): there the first signal raises :class:`StopInterrupt` from the
handler, wherever the main thread is. The region's owner puts back what the work changed
(a training step before its optimizer step: ``SimpleTrainer``; an evaluation changes nothing)
and calls :func:`stop_interrupted`, which saves the checkpoint of the last finished
iteration through the Preemption hook; the run ends with the same error, exit status and
resume line as a stop after a step. A checkpoint save never runs in a region: a signal
during one lets it finish, and the run stops right after it.

A region is interruptible only where its stop needs no other worker: in a one-process run,
and on the main worker (rank 0) of a job, which saves the checkpoint of the last finished
iteration without any collective (the weights are the same on every worker) and ends; its
launcher (or torchrun) then stops the others, which may be waiting for it in a collective.
In the other workers' regions a signal is only recorded, as outside regions (their stop
follows the main worker's). A signal that only the launcher got reaches the workers' regions
through :func:`set_external_stop_flag`'s flag (a watcher thread in each worker signals its
main thread while it is in a region), so that no worker is signalled outside the handlers,
e.g. while it starts up.

A terminal's Ctrl-C reaches the launcher and every worker, and torchrun forwards the
signal it gets to its workers once more: a repeat of the same signal within
:data:`REPEAT_WINDOW_S` seconds counts as the same request. A signal to the process group
(Ctrl-C, a batch scheduler's cancel) also ends the data-loader workers; the training loop
then loads the batches left before the stop in the main process (``reliability.loader_faults``).
"""
import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional

import torch
import torch.distributed as dist

from ..utils import comm
from ..utils.errors import ReidUserError

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "STOP_SIGNALS",
    "TrainingPreempted",
    "StopInterrupt",
    "install_stop_handlers",
    "interruptible",
    "end_interruptible",
    "handling_stops",
    "can_interrupt",
    "stop_interrupted",
    "defer_stop",
    "take_deferred_stop",
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

#: seconds between two looks of the main worker's watcher at the launcher's shared stop flag
EXTERNAL_FLAG_POLL_S = 0.1

# "signal": this process's first stop signal; "external": the launcher's shared flag;
# "handling": install_stop_handlers' handlers are in place; "on_interrupt": the saver of an
# interrupted region (None: regions are not interruptible); "region": the work of the region
# the main thread is in now (None: none); "deferred": a stop raised in a hook's after_train,
# for the Preemption hook to raise after its own.
_state: Dict[str, Any] = {"signal": None, "external": None, "handling": False, "on_interrupt": None, "region": None,
                          "deferred": None}


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
        the run continues from the last checkpoint on disk. Iteration -1 is the state before
        the first step (a stop in the first step of a new run, e.g. while it compiles)."""
        if checkpoint and iteration < 0:
            return cls(f"training stopped by {signal_name(signum)} before its first iteration finished: checkpoint "
                       f"{checkpoint} (the state it starts from) saved; continue with {resume}", signum, iteration,
                       checkpoint)
        if not checkpoint:
            return cls(f"training stopped by {signal_name(signum)} during iteration {iteration}, which could not "
                       "finish without its data-loader workers (stopped by the same signal): no new checkpoint; "
                       f"continue from the last one in OUTPUT_DIR with {resume}", signum, iteration, checkpoint)
        return cls(f"training stopped by {signal_name(signum)} after iteration {iteration}: checkpoint {checkpoint} "
                   f"saved; continue with {resume}", signum, iteration, checkpoint)


class StopInterrupt(BaseException):
    """A stop signal that arrived inside an interruptible region (:func:`interruptible`),
    raised by the signal handler wherever the main thread was.

    A BaseException like KeyboardInterrupt, so that the ``except Exception`` of the code it
    crosses lets it through: torch.compile wraps the exceptions of its compilers in its own
    (which CompileGuard would take for a compile error and answer with an eager retry or a
    CompileFailedError), and the training loop treats exceptions as failures. The region's
    owner catches it, puts back what the interrupted work changed and raises
    :func:`stop_interrupted`'s error instead.

    Attributes:
        signum: the signal.
        what: the region, in words ("the training step", "the evaluation").
    """

    def __init__(self, signum: int, what: str = ""):
        super().__init__(signum, what)
        self.signum, self.what = int(signum), what


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


def install_stop_handlers(on_interrupt: Optional[Callable[[int, int], TrainingPreempted]] = None
                          ) -> Callable[[], None]:
    """Record SIGTERM / SIGUSR1 / SIGINT as stop requests instead of dying at once.

    Only the main thread of a process can install signal handlers; elsewhere nothing is
    installed (logged) and the returned function does nothing.

    Args:
        on_interrupt: makes the regions of this process interruptible (one-process runs and
            the main worker of a job only, see the module doc): called by
            :func:`stop_interrupted` as ``on_interrupt(signum, iteration)`` once the trainer
            holds the state of the finished `iteration`, it saves that checkpoint without
            any collective and returns the :class:`TrainingPreempted` to raise. None: a
            signal is only recorded, also inside regions.
    Returns:
        a function that puts the previous handlers back and forgets the request.
    """
    if threading.current_thread() is not threading.main_thread():
        logger.info("Not in the main thread: SIGTERM / SIGUSR1 / SIGINT keep their handlers (no checkpoint on preemption)")
        return lambda: None
    # The main worker stops alone, without collectives; the others follow it (module doc).
    main_worker = comm.get_world_size() == 1 or comm.is_main_process()
    _state.update(signal=None, region=None, deferred=None, handling=True,
                  on_interrupt=on_interrupt if main_worker else None)

    def on_first(signum: int) -> None:
        _state["signal"] = signum
        what = _state["region"]
        if what is not None and _state["on_interrupt"] is not None:
            _state["region"] = None  # one interruption: what follows (the save) runs to its end
            raise StopInterrupt(signum, what)

    restore_handlers = _install_handlers(on_first, on_second=lambda: None)
    flag = _state["external"]
    stop_watching = _watch_external_flag(flag) if flag is not None else (lambda: None)

    def restore() -> None:
        stop_watching()
        restore_handlers()
        _state.update(signal=None, region=None, on_interrupt=None, handling=False)

    return restore


def _watch_external_flag(flag: Any) -> Callable[[], None]:
    """Watch the launcher's shared stop flag from a daemon thread: when it is set while the
    main thread is in a region and this process got no signal itself, send the flag's
    signal to the main thread. On the main worker its handler interrupts the region; on the
    others it is recorded, so that the launcher's SIGTERM to the workers left when the main
    worker ends is a second signal, which ends them at once (a first one would be recorded
    while they wait for the main worker, until the launcher's SIGKILL seconds later).
    Outside regions the flag is read after each step anyway.

    Returns:
        a function that ends the watch.
    """
    done = threading.Event()
    main_thread = threading.main_thread().ident

    def watch() -> None:
        while not done.wait(EXTERNAL_FLAG_POLL_S):
            signum = int(flag.value)
            if signum and _state["region"] is not None and _state["signal"] is None:
                signal.pthread_kill(main_thread, signum)
                return

    thread = threading.Thread(target=watch, name="reid-stop-flag-watch", daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join()

    return stop


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def handling_stops() -> bool:
    """Whether this process's stop handlers are installed (:func:`install_stop_handlers`)
    and this is the main thread: regions entered now are watched (interruptible or not)."""
    return _state["handling"] and _in_main_thread()


def can_interrupt() -> bool:
    """Whether a region entered now would be interruptible (the Preemption hook installed
    the handlers with a saver, this is the main thread, and the main worker of a job).
    Callers prepare the undoing of the region's work (a snapshot) only when it is."""
    return _state["on_interrupt"] is not None and _in_main_thread()


@contextlib.contextmanager
def interruptible(what: str) -> Iterator[None]:
    """An interruptible region: inside, the first stop signal raises :class:`StopInterrupt`
    from the handler, wherever the main thread is (see the module doc); a request already
    pending when the region starts raises it at once.

    Where :func:`can_interrupt` says no (another worker than the main one) a signal is only
    recorded, as outside regions; where :func:`handling_stops` says no, and inside another
    region (the outer one rules), it is a plain block. The owner catches the StopInterrupt
    outside the block, puts back what the work changed and raises :func:`stop_interrupted`'s
    error. Keep checkpoint saves and any other work that must finish once begun out of
    regions, or end the region first (:func:`end_interruptible`).

    Args:
        what: the work, in words, for the log ("the training step", "the evaluation").
    """
    if not handling_stops() or _state["region"] is not None:
        yield
        return
    _state["region"] = what
    try:
        signum = requested_signal()  # after entering: a signal arriving meanwhile raises in the handler
        if signum and can_interrupt():
            _state["region"] = None
            raise StopInterrupt(signum, what)
        yield
    finally:
        _state["region"] = None


def end_interruptible() -> None:
    """End the current interruptible region early (no-op outside one): from here on the
    work must finish, e.g. a training step's optimizer step, which changes the weights."""
    _state["region"] = None


def stop_interrupted(stop: StopInterrupt, iteration: int) -> TrainingPreempted:
    """The error that ends training after `stop` interrupted a region, once the trainer
    holds the state of the finished `iteration` (-1: the state before the first step).

    Calls the saver given to :func:`install_stop_handlers` (the Preemption hook: it saves
    that iteration's checkpoint without any collective).

    Args:
        stop: the StopInterrupt the region raised.
        iteration: the last finished iteration, whose state the trainer holds now.
    Returns:
        the TrainingPreempted to raise (with the saved checkpoint).
    """
    on_interrupt = _state["on_interrupt"]
    if on_interrupt is None:  # the handlers were put back meanwhile: nothing can save
        return TrainingPreempted.stopped(stop.signum, iteration, "")
    state = "the start" if iteration < 0 else f"iteration {iteration}"
    logger.warning(f"{signal_name(stop.signum)} interrupted {stop.what}: stopping with the checkpoint of {state} "
                   "(send it again to stop at once)")
    return on_interrupt(stop.signum, iteration)


def defer_stop(error: TrainingPreempted) -> None:
    """Keep a stop raised in a hook's ``after_train`` (an interrupted final evaluation) for
    the Preemption hook, which raises it after its own ``after_train``: the hooks after the
    interrupted one still end their training (writers, the best checkpoint)."""
    _state["deferred"] = error


def take_deferred_stop() -> Optional[TrainingPreempted]:
    """The stop kept by :func:`defer_stop` (None when there is none); forgets it."""
    error, _state["deferred"] = _state["deferred"], None
    return error


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
        logger.warning("Received %s: the workers save a checkpoint after their current step (or at once while "
                       "compiling or evaluating) and stop (send it again to stop at once)", signal_name(signum))

    return _install_handlers(on_first, on_second)
