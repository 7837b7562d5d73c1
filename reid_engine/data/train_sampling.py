"""The training sampler: its per-worker batch size, its construction from the config, and the
batch sampler that tags every index with its stream key ``(seed, rank, position)``."""

from typing import Iterator, List, Tuple

import numpy as np

from reid_engine.config import ConfigError
from reid_engine.utils import comm

from .samplers import SAMPLER_REGISTRY, InfiniteSampler

__all__ = ["per_worker_batch", "build_train_sampler", "StreamBatchSampler"]


def per_worker_batch(total: int, world_size: int, key: str) -> int:
    """Return ``total // world_size`` or raise a one-line error if it does not divide.

    Args:
        total: the global batch size (e.g. SOLVER.IMS_PER_BATCH).
        world_size: the number of workers.
        key: the config key of ``total``, named in the error.
    Raises:
        ConfigError: ``total`` is not a positive multiple of ``world_size``.
    """
    if total < 1 or total % world_size:
        raise ConfigError(f"{key} ({total}) must be a positive multiple of the number of "
                         f"workers ({world_size})")
    return total // world_size


def build_train_sampler(cfg, items, domains: np.ndarray, batch_size: int,
                        seed: int) -> InfiniteSampler:
    """Instantiate ``DATALOADER.SAMPLER_TRAIN`` with the extra inputs its class asks for.

    Args:
        cfg: the config (DATALOADER.SAMPLER_TRAIN, NUM_INSTANCE, SET_WEIGHT; SOLVER.IMS_PER_BATCH in the error).
        items: the training items ``(path, pid, camid)``.
        domains: (N,) the items' training set indices (the samplers' ``set_ids``).
        batch_size: images per batch on this worker (see :func:`per_worker_batch`).
        seed: the stream seed.
    Returns:
        the sampler of this worker (rank and world size from ``comm``).
    Raises:
        ConfigError: a P x K sampler whose batch is not a positive multiple of DATALOADER.NUM_INSTANCE.
    """
    name = cfg.DATALOADER.SAMPLER_TRAIN
    cls = SAMPLER_REGISTRY.get(name)
    available = {"num_instances": cfg.DATALOADER.NUM_INSTANCE, "set_ids": domains,
                 "set_weight": list(cfg.DATALOADER.SET_WEIGHT)}
    extra = {k: available[k] for k in cls.extra_args}
    k = cfg.DATALOADER.NUM_INSTANCE
    if "num_instances" in extra and (k < 1 or batch_size % k):
        raise ConfigError(
            f"{name}: SOLVER.IMS_PER_BATCH ({cfg.SOLVER.IMS_PER_BATCH}) gives {batch_size} "
            f"images per worker, which must be a positive multiple of DATALOADER.NUM_INSTANCE "
            f"({k}); change one of them")
    return cls(items, batch_size, seed=seed, rank=comm.get_rank(),
               world_size=comm.get_world_size(), **extra)


class StreamBatchSampler:
    """Group a training sampler's indices into batches of ``(index, (seed, rank, position))``.

    Positions count from ``sampler.start``, so a resumed sampler tags samples exactly as the
    uninterrupted stream did.

    Args:
        sampler: an :class:`InfiniteSampler`.
        batch_size: samples per batch on this rank.
    """

    def __init__(self, sampler: InfiniteSampler, batch_size: int):
        self.sampler = sampler
        self.batch_size = int(batch_size)

    def __iter__(self) -> Iterator[List[Tuple[int, Tuple[int, int, int]]]]:
        seed, rank, position = self.sampler.seed, self.sampler.rank, self.sampler.start
        batch = []
        for index in self.sampler:
            batch.append((index, (seed, rank, position)))
            position += 1
            if len(batch) == self.batch_size:
                yield batch
                batch = []
