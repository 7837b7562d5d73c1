"""Reads with a deadline in this process's own threads (the image cache's fill, a loader without
worker processes): a read that never returns ends the wait with one line naming the file.

A file read in a thread cannot be interrupted, so the work runs in daemon threads and the
caller waits for their results in polls; each thread marks the file it is reading
(:func:`reading`, called by the image decoder). When one of them has been reading one file for
longer than the hang limit, the caller logs the stacks of that thread (faulthandler, also kept in
a file) and raises :class:`ReadHangError`. The stuck thread is left behind: being a daemon, it
does not keep the process from exiting, and nothing it would have written is written.

The limit is the one the loader workers' watchdog uses (DATALOADER.HANG_TIMEOUT): a fixed number
of seconds, or 0 = automatic, :data:`HANG_TIMEOUT_FACTOR` x the slowest read (or batch) seen, at
least :data:`HANG_TIMEOUT_FLOOR`. Settings come in as arguments (this layer reads no config).
"""
import contextlib
import faulthandler
import logging
import os
import queue
import re
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from reid_engine.utils.errors import ReidUserError

__all__ = ["ReadHangError", "HANG_TIMEOUT_FACTOR", "HANG_TIMEOUT_FLOOR", "HANG_FIX", "hang_limit", "hang_setting",
           "reading", "reads_in_progress", "ReadDeadline", "map_with_deadline", "iterate_with_deadline"]

logger = logging.getLogger(__name__)

#: the automatic hang limit: this many times the slowest read (or batch) so far, and at least the floor
#: (a first read of a cold file system, worker start-up)
HANG_TIMEOUT_FACTOR = 10.0
HANG_TIMEOUT_FLOOR = 60.0
#: what to do about a read that hangs, in every such error
HANG_FIX = ("find what blocks the read (a stalled network file system, a deadlocked image decoder) or raise "
            "DATALOADER.HANG_TIMEOUT, then run again (a training run with --resume: the checkpoints on disk "
            "are intact)")
#: the longest single wait between two checks
_POLL_S = 5.0

# thread ident -> (path, start on the monotonic clock) of the read that thread is in
_reads: Dict[int, Tuple[str, float]] = {}
_slowest_read = [0.0]


class ReadHangError(ReidUserError, RuntimeError):
    """A read did not return within the hang limit (a named pipe, a stalled network file system).

    Attributes:
        path: the file being read (None when unknown).
        stack_files: the files holding the stacks of the stuck reader's threads.
    """

    def __init__(self, message: str, path: Optional[str] = None, stack_files: Tuple[str, ...] = ()):
        super().__init__(message)
        self.path, self.stack_files = path, tuple(stack_files)


def hang_limit(timeout: float, slowest: float) -> float:
    """The seconds a read (or batch) may take: ``timeout``, or when it is 0 the automatic limit
    from the ``slowest`` one seen so far."""
    return float(timeout) if timeout else max(HANG_TIMEOUT_FLOOR, HANG_TIMEOUT_FACTOR * slowest)


def hang_setting(timeout: float, limit: float, unit: str = "batch", key: str = "DATALOADER.HANG_TIMEOUT") -> str:
    """How the limit was set, for the error line: ``DATALOADER.HANG_TIMEOUT 3 s`` or the automatic rule."""
    if timeout:
        return f"{key} {timeout:g} s"
    return (f"{key} auto = {limit:.0f} s: {HANG_TIMEOUT_FACTOR:g} x the slowest {unit}, "
            f"at least {HANG_TIMEOUT_FLOOR:g} s")


@contextlib.contextmanager
def reading(path: str) -> Iterator[None]:
    """Mark the calling thread as reading ``path`` while the block runs (a dict write: cheap)."""
    ident = threading.get_ident()
    outer = _reads.get(ident)
    start = time.monotonic()
    _reads[ident] = (str(path), start)
    try:
        yield
    finally:
        _slowest_read[0] = max(_slowest_read[0], time.monotonic() - start)
        if outer is None:
            _reads.pop(ident, None)
        else:
            _reads[ident] = outer


def reads_in_progress() -> Dict[int, Tuple[str, float]]:
    """``{thread ident: (path, seconds so far)}`` of the reads this process's threads are in."""
    now = time.monotonic()
    return {ident: (path, now - start) for ident, (path, start) in list(_reads.items())}


def _thread_stacks(ident: int) -> Tuple[str, str]:
    """Write the stacks of every thread of this process into a kept file: (file, the text of thread ``ident``)."""
    folder = tempfile.mkdtemp(prefix="reid-read-stacks-")
    path = os.path.join(folder, f"pid{os.getpid()}.txt")
    with open(path, "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    with open(path) as f:
        text = f.read()
    # faulthandler writes "Thread 0x<ident> (most recent call first):" sections, blank-line separated.
    for section in re.split(r"\n\s*\n", text):
        if re.search(rf"0x0*{ident:x}\b", section):
            return path, section.strip()
    return path, text.strip()


class ReadDeadline:
    """Waits on this process's reader threads with the hang limit.

    Args:
        timeout: DATALOADER.HANG_TIMEOUT in seconds (0 = automatic from the slowest read).
        what: what the reads are for, in the error ("the decoded-image cache", "a batch of Market1501 query").
        fix: the error line's last part (what to do).
    """

    def __init__(self, timeout: float = 0.0, what: str = "an image", fix: str = HANG_FIX):
        self.timeout, self.what, self.fix = float(timeout), what, fix
        self._poll = min(_POLL_S, self.timeout) if self.timeout else _POLL_S

    def limit(self) -> float:
        """The seconds one read may take."""
        return hang_limit(self.timeout, _slowest_read[0])

    def get(self, results: "queue.Queue", threads: Sequence[threading.Thread]) -> Any:
        """The next item of ``results``; raises :class:`ReadHangError` when one of ``threads``
        has been reading one file for longer than :meth:`limit` (checked every poll)."""
        started = time.monotonic()
        while True:
            try:
                return results.get(timeout=self._poll)
            except queue.Empty:
                pass
            self.check(threads, time.monotonic() - started)

    def check(self, threads: Sequence[threading.Thread], waited: float) -> None:
        """Raise :class:`ReadHangError` if one of ``threads`` is stuck in a read."""
        limit, reads = self.limit(), reads_in_progress()
        stuck = sorted(((reads[t.ident][1], t) for t in threads if t.ident in reads and reads[t.ident][1] >= limit),
                       key=lambda pair: -pair[0])
        if stuck:
            raise self._hang_error(stuck, reads, waited, limit)

    def _hang_error(self, stuck, reads, waited: float, limit: float) -> ReadHangError:
        seconds, thread = stuck[0]
        path = reads[thread.ident][0]
        stack_file, text = _thread_stacks(thread.ident)
        logger.error("Stacks of thread %s of this process (the one stuck reading '%s'), all threads' in %s:\n%s",
                     thread.name, path, stack_file, text)
        others = f" ({len(stuck) - 1} more thread(s) stuck too)" if len(stuck) > 1 else ""
        return ReadHangError(
            f"a read for {self.what} did not return within {limit:g} s ({hang_setting(self.timeout, limit, 'read')}): thread "
            f"{thread.name} of this process has been reading '{path}' for {seconds:.1f} s{others}; its stack is logged "
            f"above, those of all threads are kept in {stack_file}: {self.fix}", path=path, stack_files=(stack_file,))


@contextlib.contextmanager
def _stopping(stop: threading.Event, threads: Sequence[threading.Thread], deadline: ReadDeadline) -> Iterator[None]:
    """On the way out, tell ``threads`` to stop and wait (at most a poll) for them to finish their
    current job, unless one is stuck in a read: a daemon thread still running torch or Pillow code
    while the interpreter exits can abort the process, which would lose the exit status."""
    try:
        yield
    except ReadHangError:
        stop.set()
        raise
    finally:
        if not stop.is_set():
            stop.set()
            give_up = time.monotonic() + min(_POLL_S, deadline.limit())
            for thread in threads:
                thread.join(max(0.0, give_up - time.monotonic()))


def map_with_deadline(task: Callable[[Any], Any], jobs: Iterable[Any], num_threads: int, deadline: ReadDeadline,
                      name: str = "reader") -> Iterator[Any]:
    """``task(job)`` for every job on ``num_threads`` daemon threads; yields the results as they come
    (in no set order). A task's exception is raised here; a read stuck past the deadline raises
    :class:`ReadHangError` (the other threads stop after their current job).
    """
    pending: "queue.SimpleQueue" = queue.SimpleQueue()
    jobs = list(jobs)
    for job in jobs:
        pending.put(job)
    results: "queue.Queue" = queue.Queue()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                job = pending.get_nowait()
            except queue.Empty:
                return
            try:
                results.put((True, task(job)))
            except BaseException as exc:  # raised in the caller's thread
                results.put((False, exc))
                return

    threads = [threading.Thread(target=work, name=f"{name}-{i}", daemon=True)
               for i in range(max(1, min(int(num_threads), len(jobs))))]
    for thread in threads:
        thread.start()
    with _stopping(stop, threads, deadline):
        for _ in range(len(jobs)):
            ok, value = deadline.get(results, threads)
            if not ok:
                raise value
            yield value


_END = object()


def iterate_with_deadline(iterable: Iterable[Any], deadline: ReadDeadline, name: str = "reader") -> Iterator[Any]:
    """Iterate ``iterable`` in a daemon thread, one item ahead; a read of it stuck past the deadline
    raises :class:`ReadHangError` here. Its exceptions are raised here, with their tracebacks."""
    handoff: "queue.Queue" = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item: Tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in iterable:
                if not put((True, item)):
                    return
            put((True, _END))
        except BaseException as exc:
            put((False, exc))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    threads: List[threading.Thread] = [thread]
    with _stopping(stop, threads, deadline):
        while True:
            ok, value = deadline.get(handoff, threads)
            if not ok:
                raise value
            if value is _END:
                return
            yield value
