"""The history of one training scalar: its (value, iteration) pairs and global average,
savable in a checkpoint so that a resumed run smooths exactly like an uninterrupted one."""

from typing import List, Optional, Tuple

import numpy as np
import torch

__all__ = ["ScalarHistory", "windowed_median"]


class ScalarHistory:
    """The (value, iteration) pairs of one scalar, newest last, plus its global average.

    Reads like fvcore's ``HistoryBuffer`` (``update``, ``latest``, ``values``,
    ``global_avg``, ``median``, ``avg``) and adds ``state_dict`` / ``load_state_dict``.

    Args:
        max_length: how many pairs to keep; older ones are dropped (the global average
            still counts them).
    """

    def __init__(self, max_length: int = 1_000_000):
        self._max_length = int(max_length)
        self._data: List[Tuple[float, int]] = []
        self._count = 0
        self._global_avg = 0.0

    def update(self, value: float, iteration: Optional[int] = None) -> None:
        """Append `value` written at `iteration` (default: the number of updates so far)."""
        if iteration is None:
            iteration = self._count
        if len(self._data) == self._max_length:
            del self._data[0]
        self._data.append((float(value), int(iteration)))
        self._count += 1
        # Running mean (as fvcore computes it), so that resumed runs report the same value.
        self._global_avg += (value - self._global_avg) / self._count

    def latest(self) -> float:
        """The newest value."""
        return self._data[-1][0]

    def values(self) -> List[Tuple[float, int]]:
        """The kept (value, iteration) pairs, oldest first (the internal list: do not modify)."""
        return self._data

    def global_avg(self) -> float:
        """The mean of every value ever written, dropped ones included."""
        return self._global_avg

    def median(self, window: int) -> float:
        """The median of the last `window` values."""
        return float(np.median([v for v, _ in self._data[-window:]]))

    def avg(self, window: int) -> float:
        """The mean of the last `window` values."""
        return float(np.mean([v for v, _ in self._data[-window:]]))

    def state_dict(self, max_values: int) -> dict:
        """The last `max_values` pairs plus the global statistics, as tensors and plain
        numbers so that ``torch.load(weights_only=True)`` accepts them.

        Args:
            max_values: how many of the newest pairs to save.

        Returns:
            dict with ``values``, ``iters``, ``count`` and ``global_avg``.
        """
        data = self._data[-max_values:]
        return {
            "values": torch.tensor([v for v, _ in data], dtype=torch.float64),
            "iters": torch.tensor([i for _, i in data], dtype=torch.int64),
            "count": int(self._count),
            "global_avg": float(self._global_avg),
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the content with a state produced by :meth:`state_dict`."""
        pairs = zip(state["values"].tolist(), state["iters"].tolist())
        self._data = [(float(v), int(i)) for v, i in pairs][-self._max_length:]
        self._count = int(state["count"])
        self._global_avg = float(state["global_avg"])


def windowed_median(history: ScalarHistory, window: int) -> float:
    """Median of the values of `history` written in its last `window` iterations.

    Args:
        history: the scalar's history.
        window: number of iterations, counted back from the newest value's iteration.

    Returns:
        The median as a python float.
    """
    data = history.values()
    newest_iter = data[-1][1]
    selected = []
    for value, itr in reversed(data):
        if itr <= newest_iter - window:
            break
        selected.append(value)
    return float(np.median(selected))
