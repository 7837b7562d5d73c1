"""The writers that publish training metrics, and the event storage they read.

Code running inside a training loop records scalars, images and histograms into the
current :class:`EventStorage` (found with :func:`get_event_storage`; both live in
:mod:`.event_storage` and are re-exported here); writers (:class:`CommonMetricPrinter`,
:class:`JSONWriter`, :class:`TensorboardXWriter`) read it periodically and publish what is new.
"""

import datetime
import json
import logging
import os
import socket
import struct
import time
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch

from .event_storage import EventStorage, get_event_storage
from .file_io import RecordFile, write_failure
from .scalar_history import windowed_median

__all__ = [
    "collect_new_scalars",
    "EventStorage",
    "get_event_storage",
    "EventWriter",
    "CommonMetricPrinter",
    "JSONWriter",
    "TensorboardXWriter",
]


class EventWriter:
    """Base class of writers that publish the content of the current EventStorage."""

    def write(self) -> None:
        """Publish what is new in the current storage."""
        raise NotImplementedError

    def close(self) -> None:
        """Release files or other resources; the default does nothing."""


def collect_new_scalars(storage: EventStorage, window: int, last_write: int) -> Dict[int, Dict[str, float]]:
    """The (smoothed) latest scalars written after iteration `last_write`, grouped by iteration.

    Shared by the writers that send every new scalar once (JSON, TensorBoard, MLflow).

    Args:
        storage: the run's event storage.
        window: the smoothing window of scalars whose hint asks for smoothing.
        last_write: the last iteration already written.
    Returns:
        {iteration: {name: value}}, in iteration order.
    """
    by_iter: Dict[int, Dict[str, float]] = defaultdict(dict)
    for name, (value, itr) in storage.latest_with_smoothing_hint(window).items():
        if itr > last_write:
            by_iter[itr][name] = value
    return dict(sorted(by_iter.items()))


def _not_written(iterations: Iterable[int]) -> str:
    """What a failed write leaves out and how to get it back, for its error message."""
    its = sorted(iterations)
    named = f"iteration {its[0]}" if len(its) == 1 else f"iterations {', '.join(map(str, its))}"
    # A resumed run repeats every step after the last checkpoint, and so writes these again.
    return f"then continue with --resume (the records of {named} are not in it)"


class JSONWriter(EventWriter):
    """Append one JSON object per iteration (with an ``iteration`` key) holding the
    scalars written since the previous write; flushed after every write."""

    def __init__(self, json_file: str, window_size: int = 20):
        """
        Args:
            json_file: path of the file; appended to when it exists.
            window_size: smoothing window (iterations) for scalars with a smoothing hint.

        Raises:
            FileWriteError: the file cannot be created or opened (one line).
        """
        self._path = json_file
        try:
            os.makedirs(os.path.dirname(os.path.abspath(json_file)), exist_ok=True)
            # Whole lines or nothing: a failed write never leaves half a line for the
            # resumed run to append after (the file would no longer parse).
            self._file_handle = RecordFile(json_file, "metrics to")
        except OSError as e:
            raise write_failure(json_file, e, "metrics to") from None
        self._window_size = window_size
        self._last_write = -1

    def write(self) -> None:
        """Append the lines for every iteration with new scalars (all of them, or none).

        Raises:
            FileWriteError: the disk is full (or another write failure): one line naming
                the file, the free space and the iterations whose records are not in it.
        """
        new = collect_new_scalars(get_event_storage(), self._window_size, self._last_write)
        if not new:
            return
        lines = "".join(json.dumps({**scalars, "iteration": itr}, sort_keys=True) + "\n" for itr, scalars in new.items())
        try:
            self._file_handle.write(lines)
            self._file_handle.flush()
        except OSError as e:
            raise write_failure(self._path, e, "metrics to", then=_not_written(new)) from None
        self._last_write = max(new)

    def close(self) -> None:
        """Close the file."""
        self._file_handle.close()


def _tfrecord(data: bytes) -> bytes:
    """One record of a tensorboard event file (TFRecord framing: length, CRCs, data)."""
    from tensorboardX.record_writer import masked_crc32c

    header = struct.pack("Q", len(data))
    return header + struct.pack("I", masked_crc32c(header)) + data + struct.pack("I", masked_crc32c(data))


class TensorboardXWriter(EventWriter):
    """Write new scalars, queued images and histograms to a tensorboard event file.

    The file (``events.out.tfevents.<time>.<host>``, tensorboard's format, built with
    tensorboardX's summary functions) is created on the first write. Each write appends
    its events whole and at once, in the calling thread: a failed write (disk full, size
    limit) raises here, at the iteration it happened, and never leaves half an event in
    the file. (tensorboardX's ``SummaryWriter`` writes from a background thread that
    dies on such an error, after which the training hangs on its full queue.)
    """

    def __init__(self, log_dir: str, window_size: int = 20, filename_suffix: str = ""):
        """
        Args:
            log_dir: directory of the event files.
            window_size: smoothing window (iterations) for scalars with a smoothing hint.
            filename_suffix: appended to the event file's name.
        """
        # Imported here, not at module level (slow; only tensorboard users pay it) and not
        # on first write (that would land inside the training loop).
        from tensorboardX import summary
        from tensorboardX.proto.event_pb2 import Event

        self._summary, self._event = summary, Event
        self._log_dir = log_dir
        self._window_size = window_size
        self._suffix = filename_suffix
        self._file: Optional[RecordFile] = None
        self._last_write = -1

    def _events(self, storage: EventStorage, new: Dict[int, Dict[str, float]]) -> List:
        """The events of this write: new scalars, then the queued images and histograms."""
        now, summary, event = time.time(), self._summary, self._event
        events = [event(wall_time=now, step=itr, summary=summary.scalar(name, value))
                  for itr, scalars in new.items() for name, value in scalars.items()]
        events += [event(wall_time=now, step=itr, summary=summary.image(name, img, dataformats="CHW"))
                   for name, img, itr in storage.images]
        for params in storage.histograms:
            params = dict(params)
            step = params.pop("global_step")
            events.append(event(wall_time=now, step=step, summary=summary.histogram_raw(params.pop("tag"), **params)))
        return events

    def write(self) -> None:
        """Publish new scalars, then the queued images and histograms (and clear them).

        Raises:
            FileWriteError: the disk is full (or another write failure): one line naming
                the file, the free space and the iterations whose events are not in it.
        """
        storage = get_event_storage()
        new = collect_new_scalars(storage, self._window_size, self._last_write)
        if not (new or storage.images or storage.histograms):
            return
        events = self._events(storage, new)
        path = self._file.name if self._file is not None else os.path.join(
            self._log_dir, f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{self._suffix}")
        try:
            if self._file is None:
                os.makedirs(self._log_dir, exist_ok=True)
                self._file = RecordFile(path, "tensorboard events to")
                events.insert(0, self._event(wall_time=time.time(), file_version="brain.Event:2"))
            self._file.write(b"".join(_tfrecord(e.SerializeToString()) for e in events))
        except OSError as e:
            lost = set(new) | {itr for _, _, itr in storage.images} | {h["global_step"] for h in storage.histograms}
            raise write_failure(path, e, "tensorboard events to", then=_not_written(lost)) from None
        if new:
            self._last_write = max(new)
        storage.clear_images()
        storage.clear_histograms()

    def close(self) -> None:
        """Close the event file (if one was created)."""
        if self._file is not None:
            self._file.close()
            self._file = None


class CommonMetricPrinter(EventWriter):
    """Log one line of training progress per write::

        eta: 0:01:23  iter: 19  total_loss: 1.234  loss_cls: 1.1  time: 0.1012  data_time: 0.0021  lr: 0.00035  max_mem: 812M

    Losses and times are medians over the window; the ETA uses the median ``time`` of the
    last 1000 timed steps, so the IterationTimer's warm-up steps (compilation) never enter it.
    ``max_mem`` (peak CUDA memory allocated) is shown only when the training device is a GPU,
    so a CPU run prints the same line on a machine with or without CUDA.
    Nothing is printed once training completed (storage iteration == max_iter).
    """

    def __init__(self, max_iter: Optional[int], window_size: int = 20, device: Union[str, torch.device] = "cpu"):
        """
        Args:
            max_iter: total number of iterations (for the ETA); None disables the ETA.
            window_size: smoothing window in iterations.
            device: the training device; "cuda" adds the peak memory of that device.
        """
        self.logger = logging.getLogger(__name__)
        self._max_iter = max_iter
        self._window_size = window_size
        self._cuda_device = torch.device(device) if torch.device(device).type == "cuda" else None
        self._last_write: Optional[Tuple[int, float]] = None  # (iteration, time) for ETA fallback

    def _eta(self, storage: EventStorage) -> Optional[str]:
        iteration = storage.iter
        remaining = self._max_iter - iteration - 1
        if remaining <= 0:
            return "0:00:00"
        if "time" in storage.histories():
            eta_seconds = windowed_median(storage.history("time"), 1000) * remaining
            storage.put_scalar("eta_seconds", eta_seconds, smoothing_hint=False)
        else:
            # Before the timer's warm-up ends: estimate from the wall time between writes.
            now = time.perf_counter()
            previous, self._last_write = self._last_write, (iteration, now)
            if previous is None or iteration <= previous[0]:
                return None
            eta_seconds = (now - previous[1]) / (iteration - previous[0]) * remaining
        return str(datetime.timedelta(seconds=int(eta_seconds)))

    def write(self) -> None:
        """Log the progress line for the current iteration."""
        storage = get_event_storage()
        if self._max_iter is not None and storage.iter >= self._max_iter:
            return  # training finished: the last line was already printed
        histories = storage.histories()
        parts = []
        if self._max_iter is not None:
            eta = self._eta(storage)
            if eta is not None:
                parts.append(f"eta: {eta}")
        parts.append(f"iter: {storage.iter}")
        loss_names = [k for k in histories if "loss" in k]
        loss_names.sort(key=lambda k: k != "total_loss")  # total_loss first, others in order
        parts += [f"{k}: {windowed_median(histories[k], self._window_size):.4g}" for k in loss_names]
        for k in ("time", "data_time"):
            if k in histories:
                parts.append(f"{k}: {windowed_median(histories[k], self._window_size):.4f}")
        if "lr" in histories:
            parts.append(f"lr: {histories['lr'].latest():.5g}")
        if self._cuda_device is not None:
            parts.append(f"max_mem: {torch.cuda.max_memory_allocated(self._cuda_device) / 1024 / 1024:.0f}M")
        self.logger.info("  ".join(parts))
