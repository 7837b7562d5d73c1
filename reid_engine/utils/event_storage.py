"""The event storage: what code inside a training loop records (scalars with their history,
images, histograms) until the writers of :mod:`.events` publish it."""

import threading
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from .scalar_history import ScalarHistory, windowed_median

__all__ = ["EventStorage", "get_event_storage"]

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
