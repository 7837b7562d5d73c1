"""Event storage for training metrics and the writers that publish them.

Code running inside a training loop records scalars, images and histograms into the
current :class:`EventStorage` (found with :func:`get_event_storage`); writers
(:class:`CommonMetricPrinter`, :class:`JSONWriter`, :class:`TensorboardXWriter`) read it
periodically and publish what is new. (About 400 lines: the storage and its three
writers share one record format, so they are kept side by side.)
"""

import datetime
import json
import logging
import os
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Tuple, Union

import torch

from .file_io import write_failure
from .scalar_history import ScalarHistory, windowed_median

__all__ = [
    "EventStorage",
    "get_event_storage",
    "EventWriter",
    "CommonMetricPrinter",
    "JSONWriter",
    "TensorboardXWriter",
]

logger = logging.getLogger(__name__)

# Per thread, so that two trainers in two threads (tools/benchmarks/bench_main_job.py) each
# see their own storage.
_THREAD_STATE = threading.local()


def _storage_stack() -> List["EventStorage"]:
    """This thread's stack of open EventStorage contexts."""
    if not hasattr(_THREAD_STATE, "stack"):
        _THREAD_STATE.stack = []
    return _THREAD_STATE.stack

# How many values per scalar a checkpoint keeps: enough for every smoothing window in
# use (writers use 20, the ETA uses up to 1000), small enough to keep checkpoints lean.
_STATE_HISTORY_LENGTH = 1000


def get_event_storage() -> "EventStorage":
    """Return the innermost active :class:`EventStorage`.

    Raises:
        RuntimeError: when called outside a ``with EventStorage(...)`` block.
    """
    if not _storage_stack():
        raise RuntimeError(
            "get_event_storage() called outside an EventStorage: wrap the code in "
            "`with EventStorage(start_iter):` (the trainer opens one during train())"
        )
    return _storage_stack()[-1]


class EventStorage:
    """Per-iteration store of metrics, images and histograms.

    Use it as a context manager: while open, :func:`get_event_storage` returns it.
    Scalars keep a history (for smoothing) and the latest value with its iteration.
    """

    def __init__(self, start_iter: int = 0):
        """
        Args:
            start_iter: the iteration the storage starts at.
        """
        self._history: Dict[str, ScalarHistory] = {}
        self._smoothing_hints: Dict[str, bool] = {}
        self._latest_scalars: Dict[str, Tuple[float, int]] = {}
        self._iter = int(start_iter)
        self._current_prefix = ""
        self._vis_data: List[Tuple[str, torch.Tensor, int]] = []
        self._histograms: List[dict] = []

    # ---- scalars ------------------------------------------------------------------
    def put_scalar(self, name: str, value, smoothing_hint: bool = True, iteration: Optional[int] = None) -> None:
        """Record a scalar at the current iteration (or at `iteration`).

        Args:
            name: metric name (prefixed by the active :meth:`name_scope`).
            value: a number or a one-element tensor.
            smoothing_hint: whether writers should smooth it (windowed median) or
                show the raw latest value. Must not change for a given name.
            iteration: the iteration the value belongs to, for values fetched later
                than they were computed (default: the current iteration).
        """
        name = self._current_prefix + name
        value = float(value.item() if isinstance(value, torch.Tensor) else value)
        history = self._history.get(name)
        if history is None:
            history = self._history[name] = ScalarHistory()
            self._smoothing_hints[name] = smoothing_hint
        elif self._smoothing_hints[name] != smoothing_hint:
            raise ValueError(
                f"scalar '{name}' was first written with smoothing_hint="
                f"{self._smoothing_hints[name]}, now with {smoothing_hint}: use one value"
            )
        itr = self._iter if iteration is None else int(iteration)
        history.update(value, itr)
        self._latest_scalars[name] = (value, itr)

    def put_scalars(self, *, smoothing_hint: bool = True, iteration: Optional[int] = None, **kwargs) -> None:
        """Record several scalars at once: ``put_scalars(loss=0.5, acc=0.9)``."""
        for name, value in kwargs.items():
            self.put_scalar(name, value, smoothing_hint=smoothing_hint, iteration=iteration)

    def history(self, name: str) -> ScalarHistory:
        """Return the history of scalar ``name`` (KeyError if unknown)."""
        history = self._history.get(name)
        if history is None:
            raise KeyError(f"no history for scalar '{name}' in the EventStorage")
        return history

    def histories(self) -> Dict[str, ScalarHistory]:
        """Return all scalar histories by name."""
        return self._history

    def latest(self) -> Dict[str, Tuple[float, int]]:
        """Return ``{name: (latest value, iteration it was written at)}``."""
        return self._latest_scalars

    def latest_with_smoothing_hint(self, window: int = 20) -> Dict[str, Tuple[float, int]]:
        """Like :meth:`latest`, but scalars with a smoothing hint are replaced by the
        median of the values written in their last ``window`` iterations."""
        result = {}
        for name, (value, itr) in self._latest_scalars.items():
            if self._smoothing_hints[name]:
                value = windowed_median(self._history[name], window)
            result[name] = (value, itr)
        return result

    def smoothing_hints(self) -> Dict[str, bool]:
        """Return ``{name: smoothing_hint}`` for every scalar."""
        return self._smoothing_hints

    # ---- images and histograms ----------------------------------------------------
    def put_image(self, img_name: str, img_tensor: torch.Tensor) -> None:
        """Queue an image (CHW tensor, float in [0, 1] or uint8) for the tensorboard writer."""
        if not isinstance(img_tensor, torch.Tensor) or img_tensor.dim() != 3:
            raise ValueError(
                f"put_image('{img_name}') needs a CHW tensor, got "
                f"{getattr(img_tensor, 'shape', type(img_tensor))}"
            )
        self._vis_data.append((self._current_prefix + img_name, img_tensor.detach().cpu(), self._iter))

    def put_histogram(self, hist_name: str, hist_values, bins: int = 1000) -> None:
        """Queue a histogram of ``hist_values`` (any tensor) for the tensorboard writer."""
        values = torch.as_tensor(hist_values).detach().flatten().float().cpu()
        if values.numel() == 0:
            raise ValueError(f"put_histogram('{hist_name}') got no values")
        lo, hi = values.min().item(), values.max().item()
        counts = torch.histc(values, bins=bins, min=lo, max=hi)
        edges = torch.linspace(lo, hi, steps=bins + 1, dtype=torch.float32)
        self._histograms.append(
            dict(
                tag=self._current_prefix + hist_name,
                min=lo,
                max=hi,
                num=values.numel(),
                sum=float(values.sum()),
                sum_squares=float((values * values).sum()),
                bucket_limits=edges[1:].tolist(),
                bucket_counts=counts.tolist(),
                global_step=self._iter,
            )
        )

    @property
    def images(self) -> List[Tuple[str, torch.Tensor, int]]:
        """Queued images as (name, CHW tensor, iteration)."""
        return self._vis_data

    @property
    def histograms(self) -> List[dict]:
        """Queued histograms as keyword dicts for tensorboardX ``add_histogram_raw``."""
        return self._histograms

    def clear_images(self) -> None:
        """Drop the queued images (a writer calls it after publishing them)."""
        self._vis_data = []

    def clear_histograms(self) -> None:
        """Drop the queued histograms (a writer calls it after publishing them)."""
        self._histograms = []

    # ---- iteration and scopes -----------------------------------------------------
    def step(self) -> None:
        """Advance the iteration counter by one."""
        self._iter += 1

    @property
    def iter(self) -> int:
        """The current iteration (the trainer sets it before each step)."""
        return self._iter

    @iter.setter
    def iter(self, value: int) -> None:
        self._iter = int(value)

    @contextmanager
    def name_scope(self, name: str) -> Iterator[None]:
        """Prefix every scalar/image/histogram name written inside with ``name/``."""
        old_prefix = self._current_prefix
        self._current_prefix = name.rstrip("/") + "/"
        try:
            yield
        finally:
            self._current_prefix = old_prefix

    def __enter__(self) -> "EventStorage":
        _storage_stack().append(self)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        stack = _storage_stack()
        if not stack or stack[-1] is not self:
            raise RuntimeError("EventStorage contexts were closed out of order")
        stack.pop()

    # ---- checkpointing ------------------------------------------------------------
    def state_dict(self) -> dict:
        """Return the scalar histories (last values, bounded) and the iteration, in a
        form ``torch.load(weights_only=True)`` accepts."""
        return {
            "iteration": self._iter,
            "histories": {
                name: buf.state_dict(_STATE_HISTORY_LENGTH) for name, buf in self._history.items()
            },
            "smoothing_hints": dict(self._smoothing_hints),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the scalar histories saved by :meth:`state_dict`.

        The current iteration is kept (a resumed run starts at the next iteration);
        the "latest" values are not restored, so writers only publish what the resumed
        run writes, while the smoothed values match those of an uninterrupted run.
        """
        for name, buf_state in state["histories"].items():
            buf = ScalarHistory()
            buf.load_state_dict(buf_state)
            self._history[name] = buf
            self._smoothing_hints[name] = bool(state["smoothing_hints"][name])


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
