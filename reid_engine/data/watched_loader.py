"""The evaluation / extraction DataLoader under the hang watchdog (DATALOADER.HANG_TIMEOUT).

A read that never returns (a named pipe, a stalled network file system) ends an evaluation,
a label-free extraction or `reid-extract` as it ends training: one line naming the file,
within the hang limit. Worker processes are watched by :class:`LoaderWatchdog` (their stacks
by signal, then they are stopped); without workers the batches are loaded in a daemon thread
under :func:`~reid_engine.reliability.read_deadline.iterate_with_deadline`.
"""
from typing import Any, Iterator

from torch.utils.data import DataLoader

from reid_engine.reliability.read_deadline import HANG_FIX, ReadDeadline, iterate_with_deadline

from ..reliability.loader_watchdog import LoaderWatchdog, check_hang_timeout

__all__ = ["WatchedDataLoader", "shutdown_workers"]


def shutdown_workers(iterator: Any) -> None:
    """Stop the worker processes of torch's multi-process ``iterator`` now (left to the garbage
    collector, which a traceback's reference cycle delays, their shutdown can stall for seconds),
    or the reader thread of an :func:`iterate_with_deadline` generator."""
    shutdown = getattr(iterator, "_shutdown_workers", None) or getattr(iterator, "close", None)
    if shutdown is not None:
        shutdown()


class WatchedDataLoader(DataLoader):
    """A :class:`~torch.utils.data.DataLoader` whose every batch comes within the hang limit.

    Args:
        *args, **kwargs: as DataLoader.
        hang_timeout: DATALOADER.HANG_TIMEOUT in seconds (0 = automatic).
        what: what a batch is, in the error ("batch of Market1501 query + gallery").
    """

    def __init__(self, *args, hang_timeout: float = 0.0, what: str = "batch", **kwargs):
        super().__init__(*args, **kwargs)
        self.hang_timeout = check_hang_timeout(hang_timeout)
        self.what = what

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            yield from iterate_with_deadline(super().__iter__(), ReadDeadline(self.hang_timeout, what=f"a {self.what}"),
                                             name="data-loader")
            return
        # Before the workers start: they find the watchdog's board on the dataset.
        watchdog = LoaderWatchdog(self.dataset, self.num_workers, self.hang_timeout, what=self.what,
                                  fix=HANG_FIX)
        iterator = super().__iter__()
        try:
            while True:
                try:
                    batch = watchdog.next_batch(iterator)
                except StopIteration:
                    return
                yield batch
        except BaseException:
            shutdown_workers(iterator)
            raise
