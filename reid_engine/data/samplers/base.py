"""The infinite, rank-aware, resumable sampler base and the inference (sharding) sampler.

A training sampler defines a *global stream* of dataset indices as a sequence of epochs, each
epoch a deterministic function of ``(seed, epoch number)``. The stream is cut into global
batches of ``mini_batch_size * world_size`` indices and rank ``r`` takes slice ``r`` of each,
so ranks never overlap within a step and identity groups (consecutive runs of K indices)
stay whole on one rank. Indices are produced in the main process, so the stream does not
depend on the number of loader workers. ``start`` skips the first ``start`` indices of this
rank's stream without touching any image.

The global stream depends on the global batch, not on how it is split over workers (except
where :meth:`InfiniteSampler.world_size_dependence` says otherwise): a run resumed on another
number of workers with the same global batch continues it exactly, global batch by global batch.
"""

import logging
from typing import Dict, Iterator, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import Sampler

from reid_engine.utils import comm

__all__ = ["InfiniteSampler", "InferenceSampler", "Item", "resolve_rank"]

logger = logging.getLogger(__name__)

Item = Tuple[str, int, int]  # (img_path, pid, camid)


def resolve_rank(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """Return ``(rank, world_size)``, filling ``None`` from ``utils.comm``; validate them."""
    world_size = comm.get_world_size() if world_size is None else int(world_size)
    rank = comm.get_rank() if rank is None else int(rank)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not valid for world size {world_size}")
    return rank, world_size


class InfiniteSampler(Sampler):
    """Base of the training samplers: an endless, seeded, rank-sliced stream of indices.

    Subclasses implement :meth:`epoch_indices`. Class attribute ``extra_args`` lists the
    optional keyword inputs (``num_instances``, ``set_ids``, ``set_weight``) the loader
    builder passes to the constructor.

    Args:
        data_source: the training items ``(img_path, pid, camid)``.
        mini_batch_size: indices per batch on this rank.
        seed: the stream seed (the same on every rank); ``None`` takes
            ``comm.shared_random_seed()``.
        rank, world_size: this process's place in the job (``None`` asks ``utils.comm``).
    """

    extra_args: Tuple[str, ...] = ()

    def __init__(self, data_source: Sequence[Item], mini_batch_size: int, *,
                 seed: Optional[int] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None):
        self.num_items = len(data_source)
        if self.num_items == 0:
            raise ValueError(f"{type(self).__name__}: the training split is empty; check "
                             f"DATASETS.NAMES and that the dataset folders hold images")
        if int(mini_batch_size) < 1:
            raise ValueError(f"{type(self).__name__}: mini_batch_size must be >= 1, got "
                             f"{mini_batch_size}")
        self.mini_batch_size = int(mini_batch_size)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.global_batch_size = self.mini_batch_size * self.world_size
        self.seed = int(seed) if seed is not None else comm.shared_random_seed()
        self.start = 0
        self._lengths: Dict[int, int] = {}

    def epoch_rng(self, epoch: int) -> np.random.Generator:
        """Return the generator that decides epoch ``epoch`` (same on every rank)."""
        # The trailing 1 keeps the key distinct: numpy treats [s, 0] and [s] alike.
        return np.random.default_rng([self.seed, epoch, 1])

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """Return the global index stream of one epoch (int64 array, non-empty)."""
        raise NotImplementedError

    def epoch_length(self, epoch: int) -> int:
        """Return the length of epoch ``epoch`` (cached; subclasses may compute it directly)."""
        if epoch not in self._lengths:
            self._lengths[epoch] = len(self.epoch_indices(epoch))
        return self._lengths[epoch]

    def _locate(self, global_position: int) -> Tuple[int, int]:
        """Return ``(epoch, offset)`` of a position in the global stream."""
        epoch = 0
        while True:
            length = self.epoch_length(epoch)
            if length <= 0:
                raise RuntimeError(f"{type(self).__name__}: epoch {epoch} produced no indices")
            if global_position < length:
                return epoch, global_position
            global_position -= length
            epoch += 1

    def world_size_dependence(self) -> str:
        """Why the global stream depends on the number of workers, or "" when it does not.

        A stream that does not is the same for any split of the same global batch, so a
        checkpoint of it continues exactly on another number of workers; one that does
        cannot, and the reason goes into the resume error.
        """
        return ""

    def global_position(self, position: int) -> int:
        """Return the position in the global stream of position ``position`` of this rank's."""
        batch_no, offset = divmod(int(position), self.mini_batch_size)
        return batch_no * self.global_batch_size + self.rank * self.mini_batch_size + offset

    def set_start(self, position: int) -> None:
        """Make the next iteration begin at ``position`` of this rank's stream."""
        if position < 0:
            raise ValueError(f"sampler start must be >= 0, got {position}")
        self.start = int(position)

    def state_dict(self) -> Dict[str, int]:
        """Return ``{"seed", "start"}``: enough to rebuild the stream from ``start`` on."""
        return {"seed": self.seed, "start": self.start}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Restore the seed and start position saved by :meth:`state_dict`."""
        self.seed = int(state["seed"])
        self._lengths.clear()
        self.set_start(int(state["start"]))

    def __iter__(self) -> Iterator[int]:
        mini, glob = self.mini_batch_size, self.global_batch_size
        batch_no, offset = divmod(self.start, mini)
        epoch, pos = self._locate(batch_no * glob)
        if self.start:
            logger.info("%s resumes at position %d of rank %d's stream (epoch %d)",
                        type(self).__name__, self.start, self.rank, epoch)
        buffer = self.epoch_indices(epoch)[pos:]
        lo = self.rank * mini
        while True:
            while len(buffer) < glob:
                epoch += 1
                buffer = np.concatenate([buffer, self.epoch_indices(epoch)])
            mine = buffer[lo + offset:lo + mini]
            buffer = buffer[glob:]
            offset = 0
            yield from mine.tolist()


class InferenceSampler(Sampler):
    """Yield this rank's contiguous shard of ``range(size)`` (42 over 4 ranks: 11/11/10/10).

    Args:
        size: number of items.
        rank, world_size: this process's place in the job (``None`` asks ``utils.comm``).
    """

    def __init__(self, size: int, rank: Optional[int] = None, world_size: Optional[int] = None):
        if size < 0:
            raise ValueError(f"InferenceSampler: size must be >= 0, got {size}")
        self.size = int(size)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        base, extra = divmod(self.size, self.world_size)
        self.begin = self.rank * base + min(self.rank, extra)
        self.end = self.begin + base + (1 if self.rank < extra else 0)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.begin, self.end))

    def __len__(self) -> int:
        return self.end - self.begin
