"""A watchdog for training-loader workers that hang without dying.

torch's DataLoader notices a dead worker, but a worker stuck in a read (a stalled network file
system, a deadlocked decoder) makes the main process wait for its batch forever. Here:

- each worker writes into a shared board (one ``RawArray`` row per worker, no system calls) its
  pid, the dataset index it is reading and since when, and its slowest batch so far; and it
  registers :mod:`faulthandler` on ``SIGUSR2`` to write the stacks of all its threads into a file
  of its own (:func:`install_in_worker`, called from the loader's ``worker_init_fn``);
- the main process waits for each batch in polls of at most torch's own liveness-check interval
  (:meth:`LoaderWatchdog.next_batch`); when no batch has come for ``DATALOADER.HANG_TIMEOUT``
  seconds (0 = automatic: ``HANG_TIMEOUT_FACTOR`` x the slowest batch seen, at least
  ``HANG_TIMEOUT_FLOOR``), it asks the busy workers for their stacks, logs them and raises
  :class:`LoaderHangError`: one line naming the worker, the index and path it has been reading for
  how long, and the stack file. Nothing is saved on the way out, so the last checkpoint stays.
"""
import faulthandler
import logging
import os
import re
import shutil
import signal
import tempfile
import time
import weakref
from multiprocessing.sharedctypes import RawArray
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch.utils.data

from reid_engine.reliability.read_deadline import HANG_TIMEOUT_FACTOR, HANG_TIMEOUT_FLOOR, ReadHangError, hang_limit, hang_setting
from reid_engine.utils.errors import ConfigError

__all__ = ["LoaderHangError", "LoaderWatchdog", "install_in_worker", "check_hang_timeout",
           "HANG_TIMEOUT_FLOOR", "HANG_TIMEOUT_FACTOR"]

logger = logging.getLogger(__name__)

#: the longest single wait for a batch: torch's own interval between checks for dead workers
_POLL_S = 5.0
#: the seconds allowed for the workers' stack files to be written once asked
_DUMP_WAIT_S = 2.0
#: asks a worker for its threads' stacks (SIGUSR1 is the job's preemption signal)
STACK_SIGNAL = getattr(signal, "SIGUSR2", None)
_TIMED_OUT = re.compile(r"^DataLoader timed out after")
#: the dataset attribute that carries the board to the workers
_BOARD_ATTR = "_loader_watchdog_board"
# one board row per worker: [pid, dataset index being read, its start (monotonic; 0 = idle),
# slowest batch in seconds]
_PID, _INDEX, _SINCE, _SLOWEST = range(4)
_ROW = 4
_stack_file = None  # the worker's open stack file (faulthandler writes to its descriptor)
_RESUME_FIX = ("find what blocks the read (a stalled network file system, a deadlocked image decoder) or raise "
               "DATALOADER.HANG_TIMEOUT, then resume with --resume (the checkpoints on disk are intact)")


class LoaderHangError(ReadHangError):
    """No batch came within the hang timeout: a loader worker is stuck.

    Attributes:
        worker_id: the stuck worker (None when no worker was reading).
        index: the dataset index it was reading (None when unknown).
        stack_files: the files holding the stacks of the workers' threads.
    """

    def __init__(self, message: str, worker_id: Optional[int] = None, index: Optional[int] = None,
                 stack_files: Tuple[str, ...] = ()):
        super().__init__(message, stack_files=stack_files)
        self.worker_id, self.index = worker_id, index


def check_hang_timeout(value: Any) -> float:
    """Return DATALOADER.HANG_TIMEOUT as seconds (0 = automatic) or raise a one-line ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"DATALOADER.HANG_TIMEOUT must be a number of seconds >= 0 (0 = automatic: "
                          f"{HANG_TIMEOUT_FACTOR:g} x the slowest batch, at least {HANG_TIMEOUT_FLOOR:g} s), "
                          f"got {value!r}")
    return float(value)


class _Board:
    """The shared rows the workers write and the main process reads (picklable for spawn)."""

    def __init__(self, num_workers: int, stack_dir: str):
        self.values = RawArray("d", num_workers * _ROW)
        self.num_workers = num_workers
        self.stack_dir = stack_dir

    def get(self, worker_id: int, field: int) -> float:
        return self.values[worker_id * _ROW + field]

    def stack_path(self, worker_id: int, pid: int) -> str:
        """The stack file of worker ``worker_id`` running as ``pid``."""
        return os.path.join(self.stack_dir, f"worker{worker_id}-pid{pid}.txt")


def _index_of(key: Any) -> int:
    """The dataset index of a sampler key: training keys are ``(index, stream key)``."""
    if isinstance(key, tuple) and key:
        key = key[0]
    try:
        return int(key)
    except (TypeError, ValueError):
        return -1


def install_in_worker(worker_id: int) -> None:
    """In a loader worker: report to the board its dataset carries (if any) and dump stacks on request.

    Wraps the worker's dataset copy with a ``__getitems__`` (torch's fetcher calls it per batch)
    that records each sample's index and start time; registers faulthandler on
    :data:`STACK_SIGNAL`. A dataset without a board (evaluation loaders) is left alone.
    """
    global _stack_file
    info = torch.utils.data.get_worker_info()
    board = getattr(info.dataset, _BOARD_ATTR, None) if info is not None else None
    if board is None or not 0 <= worker_id < board.num_workers:
        return
    pid = os.getpid()
    if STACK_SIGNAL is not None:
        _stack_file = open(board.stack_path(worker_id, pid), "w")
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    values, row, dataset = board.values, worker_id * _ROW, info.dataset
    batch_items = getattr(dataset, "__getitems__", None)  # a dataset's own batch read, if it has one

    def getitems(keys: List[Any]) -> List[Any]:
        start = time.monotonic()
        try:
            if batch_items is not None:
                values[row + _INDEX], values[row + _SINCE] = _index_of(keys[0]) if keys else -1, start
                return batch_items(keys)
            samples = []
            for key in keys:
                values[row + _INDEX], values[row + _SINCE] = _index_of(key), time.monotonic()
                samples.append(dataset[key])
            return samples
        finally:
            values[row + _SINCE] = 0.0
            values[row + _SLOWEST] = max(values[row + _SLOWEST], time.monotonic() - start)

    dataset.__getitems__ = getitems
    values[row + _PID] = pid  # last: a pid on the board means the stack signal is handled


class LoaderWatchdog:
    """The main process's side: waits for batches with a deadline and explains a hang.

    Create it before the DataLoader's iterator (its workers read the board from the dataset).

    Args:
        dataset: the training dataset (the board is attached to it as an attribute).
        num_workers: the loader's worker processes (0: nothing to watch).
        timeout: DATALOADER.HANG_TIMEOUT in seconds, 0 = automatic.
        what: what the loader yields, in the error ("training batch").
        fix: the error's last part, what to do (default: find the cause, then resume).
    """

    def __init__(self, dataset, num_workers: int, timeout: float = 0.0, what: str = "training batch",
                 fix: str = ""):
        self.dataset, self.what, self.fix = dataset, what, fix or _RESUME_FIX
        self.timeout = check_hang_timeout(timeout)
        self.board: Optional[_Board] = None
        if num_workers > 0:
            stack_dir = tempfile.mkdtemp(prefix="reid-loader-stacks-")
            # The stack files go with the watchdog, unless a hang keeps them for the user to read.
            self._remove_stacks = weakref.finalize(self, shutil.rmtree, stack_dir, True)
            self.board = _Board(num_workers, stack_dir)
        setattr(dataset, _BOARD_ATTR, self.board)
        self._poll = min(_POLL_S, self.timeout) if self.timeout else _POLL_S

    def limit(self) -> float:
        """The seconds to wait for one batch: the configured timeout, or the automatic one."""
        if self.timeout:
            return self.timeout
        board = self.board
        slowest = max((board.get(w, _SLOWEST) for w in range(board.num_workers)), default=0.0) if board else 0.0
        return hang_limit(self.timeout, slowest)

    def next_batch(self, iterator: Iterator) -> Any:
        """``next(iterator)``, but a wait longer than :meth:`limit` raises :class:`LoaderHangError`.

        The wait is torch's own, in polls of at most 5 s (dead workers are still reported by
        torch as they were); the normal path costs one clock read and one attribute write.
        """
        if self.board is None or not hasattr(iterator, "_timeout"):
            return next(iterator)
        started = time.monotonic()
        iterator._timeout = self._poll  # torch's multi-process iterator reads it at each wait
        while True:
            try:
                return next(iterator)
            except RuntimeError as exc:
                if not _TIMED_OUT.match(str(exc)):
                    raise
            pin_thread = getattr(iterator, "_pin_memory_thread", None)
            if pin_thread is not None and not pin_thread.is_alive():
                raise RuntimeError("Pin memory thread exited unexpectedly")  # what torch's own wait says
            waited, limit = time.monotonic() - started, self.limit()
            if waited >= limit:
                raise self._hang_error(iterator, waited, limit)
            iterator._timeout = max(0.05, min(_POLL_S, limit - waited))

    def _hang_error(self, iterator, waited: float, limit: float) -> LoaderHangError:
        """Collect the stuck workers' stacks, log them, stop those workers; build the one-line error."""
        board, now = self.board, time.monotonic()
        # One snapshot: a worker that is merely slow may move on while the stacks are taken.
        rows = {w: [board.get(w, field) for field in range(_ROW)] for w in range(board.num_workers)}
        pids = {w: int(row[_PID]) for w, row in rows.items() if row[_PID] > 0}
        busy = sorted((w for w in pids if rows[w][_SINCE] > 0), key=lambda w: rows[w][_SINCE])
        stacks = self._dump_stacks({w: pids[w] for w in busy or pids})
        _kill_workers(iterator, [pids[w] for w in busy or pids])
        if stacks:
            self._remove_stacks.detach()  # keep the files named in the error
        for worker_id, (path, text) in stacks.items():
            logger.error("Stacks of the threads of data-loader worker %d (pid %d), also in %s:\n%s",
                         worker_id, pids[worker_id], path, text.rstrip() or "(not written)")
        head = f"no {self.what} came for {waited:.1f} s ({hang_setting(self.timeout, limit)})"
        fix = self.fix
        files = tuple(path for path, _ in stacks.values())
        if not pids:  # nothing to ask for stacks: slow imports (spawned workers) or a stuck worker_init
            return LoaderHangError(f"{head}: no data-loader worker has started yet: raise DATALOADER.HANG_TIMEOUT "
                                   "if worker start-up is this slow here, or lower DATALOADER.NUM_WORKERS")
        if not busy:
            return LoaderHangError(f"{head}: no data-loader worker is reading a sample (stuck between samples, "
                                   f"e.g. in the collate); their threads' stacks are logged above and kept in "
                                   f"{board.stack_dir}: {fix}", stack_files=files)
        worker = busy[0]
        index = int(rows[worker][_INDEX])
        path, _ = stacks.get(worker, (board.stack_path(worker, pids[worker]), ""))
        others = f" ({len(busy) - 1} more worker(s) busy, stacks logged too)" if len(busy) > 1 else ""
        return LoaderHangError(
            f"{head}: data-loader worker {worker} (pid {pids[worker]}) has been reading "
            f"{self._describe(index)} for {now - rows[worker][_SINCE]:.1f} s{others}; the stacks of its threads "
            f"are logged above and kept in {path}: {fix}", worker_id=worker, index=index if index >= 0 else None,
            stack_files=files)

    def _describe(self, index: int) -> str:
        """A dataset index as the dataset describes it, with its path: training item 12 (Market1501) '...'."""
        if index < 0:
            return "a sample of unknown index"
        describe = getattr(self.dataset, "describe_item", None)
        text = describe(index) if describe is not None else f"dataset index {index}"
        items = getattr(self.dataset, "items", None)
        if items is not None and index < len(items):
            path = items[index][0]
            if isinstance(path, (tuple, list)) and path:  # a tracklet: its first frame and how many
                text += f" '{path[0]}' (first of {len(path)} frames)"
            else:
                text += f" '{path}'"
        return text

    def _dump_stacks(self, pids: Dict[int, int]) -> Dict[int, Tuple[str, str]]:
        """Ask the workers ``{worker: pid}`` for their threads' stacks: ``{worker: (file, text)}``."""
        board, asked = self.board, {}
        if STACK_SIGNAL is None:
            return asked
        for worker, pid in pids.items():
            try:
                os.kill(pid, STACK_SIGNAL)
            except OSError:  # it died meanwhile; torch reports that itself
                continue
            asked[worker] = board.stack_path(worker, pid)
        deadline = time.monotonic() + _DUMP_WAIT_S
        sizes: Dict[int, int] = {}
        while asked and time.monotonic() < deadline:
            time.sleep(0.05)
            now_sizes = {w: _size(path) for w, path in asked.items()}
            if all(now_sizes.values()) and now_sizes == sizes:  # written and no longer growing
                break
            sizes = now_sizes
        return {w: (path, _read(path)) for w, path in asked.items()}


def _kill_workers(iterator, pids: List[int]) -> None:
    """SIGKILL the stuck workers of torch's ``iterator`` (their stacks are taken).

    Left to the loader's shutdown, each stuck worker would be waited for 5 s before being
    terminated: 40 s for 8 workers stuck on one file system. torch's SIGCHLD handler would report
    a killed worker as an error, so the iterator's pids are unregistered from it first (as its own
    shutdown does); without that private hook the shutdown is left as it is.
    """
    handling = getattr(getattr(torch.utils.data, "_utils", None), "signal_handling", None)
    if not getattr(iterator, "_worker_pids_set", False) or not hasattr(handling, "_remove_worker_pids"):
        return
    handling._remove_worker_pids(id(iterator))
    iterator._worker_pids_set = False
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
