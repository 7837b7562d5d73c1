"""The device prefetcher: a loader's batches with their tensors already on the training device."""

from typing import Any, Dict, Iterator, Optional

import torch

__all__ = ["DevicePrefetcher"]


def _to_device(batch: Dict[str, Any], device: torch.device, non_blocking: bool) -> Dict[str, Any]:
    return {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}


class DevicePrefetcher:
    """Iterate a loader's dict batches with their tensors already on ``device``, one batch ahead.

    On CUDA the copy of the next batch runs on a side stream (non-blocking, from pinned
    memory) while the current batch is used; on CPU it is a plain pass-through. With a
    resumable loader, :meth:`state_dict` counts only the batches handed to the caller.

    Args:
        loader: an iterable of dict batches (a :class:`TrainLoader` or a DataLoader).
        device: the target device.
    """

    def __init__(self, loader, device):
        self.loader = loader
        self.device = torch.device(device)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._pending = 0  # batches fetched from the loader but not yet handed out

    @property
    def dataset(self):
        """The wrapped loader's dataset."""
        return self.loader.dataset

    def _fetch(self, iterator: Iterator) -> Optional[Dict[str, Any]]:
        try:
            batch = next(iterator)
        except StopIteration:
            return None
        if self._stream is None:
            return _to_device(batch, self.device, non_blocking=False)
        with torch.cuda.stream(self._stream):
            return _to_device(batch, self.device, non_blocking=True)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        iterator = iter(self.loader)
        ahead = self._fetch(iterator)
        while ahead is not None:
            self._pending = 1
            if self._stream is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(self._stream)
                for value in ahead.values():
                    if isinstance(value, torch.Tensor):
                        value.record_stream(current)  # the side stream must not reuse it early
            batch, ahead = ahead, self._fetch(iterator)
            self._pending = 0 if ahead is None else 1
            yield batch

    # Properties that raise AttributeError keep hasattr(prefetcher, "state_dict") equal to
    # hasattr(loader, "state_dict"), so callers can test for resumability the usual way.
    @property
    def state_dict(self):
        """``loader.state_dict`` corrected for the batch held ahead (resumable loaders only)."""
        if not hasattr(self.loader, "state_dict"):
            raise AttributeError(f"{type(self.loader).__name__} has no state_dict")
        return self._state_dict

    @property
    def load_state_dict(self):
        """``loader.load_state_dict`` (resumable loaders only)."""
        return self.loader.load_state_dict

    def _state_dict(self) -> Dict[str, int]:
        state = dict(self.loader.state_dict())
        state["num_batches"] -= self._pending
        return state
