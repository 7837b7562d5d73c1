"""The writer protocol that publishes training metrics, the console printer, and the event storage they read.

Code running inside a training loop records scalars, images and histograms into the
current :class:`EventStorage` (found with :func:`get_event_storage`; both live in
:mod:`.event_storage` and are re-exported here); writers (:class:`CommonMetricPrinter` here, the
file formats' ``JSONWriter`` and ``TensorboardXWriter`` in ``reid_engine.integrations.event_writers``)
read it periodically and publish what is new.
"""

import datetime
import logging
import time
from collections import defaultdict
from typing import Dict, Optional, Tuple, Union

import torch

from .event_storage import EventStorage, get_event_storage
from .scalar_history import windowed_median

__all__ = [
    "collect_new_scalars",
    "EventStorage",
    "get_event_storage",
    "EventWriter",
    "CommonMetricPrinter",
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
