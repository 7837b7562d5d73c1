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
import time
from collections import defaultdict
from typing import Dict, Optional, Tuple, Union

import torch

from .event_storage import EventStorage, get_event_storage
from .file_io import write_failure
from .scalar_history import windowed_median

__all__ = [
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


def _collect_new_scalars(storage: EventStorage, window: int, last_write: int) -> Dict[int, Dict[str, float]]:
    """Group the (smoothed) latest scalars written after ``last_write`` by iteration."""
    by_iter: Dict[int, Dict[str, float]] = defaultdict(dict)
    for name, (value, itr) in storage.latest_with_smoothing_hint(window).items():
        if itr > last_write:
            by_iter[itr][name] = value
    return dict(sorted(by_iter.items()))


class JSONWriter(EventWriter):
    """Append one JSON object per iteration (with an ``iteration`` key) holding the
    scalars written since the previous write; flushed after every write."""

    def __init__(self, json_file: str, window_size: int = 20):
        """
        Args:
            json_file: path of the file; appended to when it exists.
            window_size: smoothing window (iterations) for scalars with a smoothing hint.
        """
        parent = os.path.dirname(os.path.abspath(json_file))
        os.makedirs(parent, exist_ok=True)
        self._path = json_file
        self._file_handle = open(json_file, "a")
        self._window_size = window_size
        self._last_write = -1

    def write(self) -> None:
        """Append the lines for every iteration with new scalars.

        Raises:
            FileWriteError: the disk is full (or another write failure), one line naming the file.
        """
        new = _collect_new_scalars(get_event_storage(), self._window_size, self._last_write)
        try:
            for itr, scalars in new.items():
                scalars["iteration"] = itr
                self._file_handle.write(json.dumps(scalars, sort_keys=True) + "\n")
            if new:
                self._last_write = max(new)
                self._file_handle.flush()
        except OSError as e:
            raise write_failure(self._path, e, "metrics to", then="then continue with --resume") from None

    def close(self) -> None:
        """Close the file."""
        self._file_handle.close()


class TensorboardXWriter(EventWriter):
    """Write new scalars, queued images and histograms to tensorboard event files.

    The tensorboardX ``SummaryWriter`` (and its file) is created on the first write.
    """

    def __init__(self, log_dir: str, window_size: int = 20, **kwargs):
        """
        Args:
            log_dir: directory of the event files.
            window_size: smoothing window (iterations) for scalars with a smoothing hint.
            kwargs: passed to ``tensorboardX.SummaryWriter``.
        """
        # Imported here, not at module level (slow; only tensorboard users pay it) and not
        # on first write (that would land inside the training loop).
        from tensorboardX import SummaryWriter

        self._summary_writer_cls = SummaryWriter
        self._log_dir = log_dir
        self._window_size = window_size
        self._writer_kwargs = kwargs
        self._writer = None
        self._last_write = -1

    def _get_writer(self):
        if self._writer is None:
            self._writer = self._summary_writer_cls(self._log_dir, **self._writer_kwargs)
        return self._writer

    def write(self) -> None:
        """Publish new scalars, then the queued images and histograms (and clear them)."""
        storage = get_event_storage()
        new = _collect_new_scalars(storage, self._window_size, self._last_write)
        if not (new or storage.images or storage.histograms):
            return
        writer = self._get_writer()
        for itr, scalars in new.items():
            for name, value in scalars.items():
                writer.add_scalar(name, value, itr)
        if new:
            self._last_write = max(new)
        for name, img, itr in storage.images:
            writer.add_image(name, img, itr)
        storage.clear_images()
        for params in storage.histograms:
            writer.add_histogram_raw(**params)
        storage.clear_histograms()

    def close(self) -> None:
        """Flush and close the event file (if one was created)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


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
