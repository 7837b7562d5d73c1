"""The training sampler: its per-worker batch size, its construction from the config, the
batch sampler that tags every index with its stream key ``(seed, 0, global position)``, and the
check that a saved stream can continue in this run (``check_stream_resume``)."""

import logging
from typing import Dict, Iterator, List, Tuple

import numpy as np

from reid_engine.config import ConfigError
from reid_engine.utils import comm

from .samplers import SAMPLER_REGISTRY, InfiniteSampler

__all__ = ["per_worker_batch", "build_train_sampler", "StreamBatchSampler", "worker_counts",
           "check_stream_resume"]

logger = logging.getLogger(__name__)


def worker_counts(total: int, multiple: int = 1) -> List[int]:
    """Return the numbers of workers that split ``total`` images into equal per-worker
    batches that are multiples of ``multiple`` (e.g. DATALOADER.NUM_INSTANCE)."""
    return [n for n in range(1, total + 1) if total % n == 0 and (total // n) % max(multiple, 1) == 0]


def _or_list(numbers: List[int]) -> str:
    """``[1, 2, 4]`` -> ``"1, 2 or 4"``."""
    text = [str(n) for n in numbers]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " or " + text[-1]


def per_worker_batch(total: int, world_size: int, key: str) -> int:
    """Return ``total // world_size`` or raise a one-line error if it does not divide.

    Args:
        total: the global batch size (e.g. SOLVER.IMS_PER_BATCH).
        world_size: the number of workers.
        key: the config key of ``total``, named in the error.
    Raises:
        ConfigError: ``total`` is not a positive multiple of ``world_size``.
    """
    if total < 1:
        raise ConfigError(f"{key} ({total}) must be a positive multiple of the number of "
                         f"workers ({world_size})")
    if total % world_size:
        # Also what a --resume on a number of workers that cannot split the run's batch meets.
        raise ConfigError(f"{key} ({total}) must be a positive multiple of the number of "
                         f"workers ({world_size}): run on a number of workers that divides it "
                         f"({_or_list(worker_counts(total))}) or change {key}")
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
        total = cfg.SOLVER.IMS_PER_BATCH
        counts = worker_counts(total, k) if k >= 1 else []
        where = f"run on {_or_list(counts)} workers or " if counts else ""
        raise ConfigError(
            f"{name}: SOLVER.IMS_PER_BATCH ({total}) gives {batch_size} "
            f"images per worker, which must be a positive multiple of DATALOADER.NUM_INSTANCE "
            f"({k}); {where}change one of them")
    return cls(items, batch_size, seed=seed, rank=comm.get_rank(),
               world_size=comm.get_world_size(), **extra)


def check_stream_resume(state: Dict[str, int], sampler: InfiniteSampler, batch_size: int) -> None:
    """Check that the loader state ``state`` (``TrainLoader.state_dict``) continues in this run.

    The stream continues exactly when the global batch (per-worker batch x workers) is the
    checkpoint's and, on another number of workers, the sampler's global stream does not depend
    on it (:meth:`InfiniteSampler.world_size_dependence`). A state without ``world_size`` (older
    checkpoints) must have this run's per-worker batch.

    Args:
        state: the saved loader state (``seed``, ``num_batches``, ``batch_size``, ``world_size``).
        sampler: this run's training sampler.
        batch_size: this run's per-worker batch.
    Raises:
        ConfigError: one line naming the checkpoint's and this run's batches and workers, and the fix.
    """
    old_batch, new_world = int(state["batch_size"]), sampler.world_size
    if "world_size" not in state:
        if old_batch != batch_size:
            raise ConfigError(
                f"the checkpoint's loader used {old_batch} images per worker but this run uses "
                f"{batch_size}; resume with the same SOLVER.IMS_PER_BATCH and number of workers")
        return
    old_world = int(state["world_size"])
    old_global, new_global = old_batch * old_world, batch_size * new_world
    if old_global != new_global:
        scaled = (" (and SOLVER.REFERENCE_WORLD_SIZE 0 if it scaled the batch to the number of workers)"
                  if old_world != new_world else "")
        raise ConfigError(
            f"--resume: the checkpoint's global batch is {old_global} images ({old_batch} per worker x "
            f"{old_world} workers) but this run's is {new_global} ({batch_size} x {new_world}); a run "
            f"continues only with its global batch: set SOLVER.IMS_PER_BATCH {old_global}{scaled}")
    if old_world != new_world:
        reason = sampler.world_size_dependence()
        if reason:
            raise ConfigError(
                f"--resume: the checkpoint was trained on {old_world} workers, this run has {new_world}: "
                f"{reason} (DATALOADER.SAMPLER_TRAIN); resume on {old_world} workers, or start a new run "
                f"from its weights (MODEL.WEIGHTS, without --resume)")
        logger.info("Resuming the data stream of %d workers on %d: the same global batch of %d images "
                    "(%d per worker instead of %d) continues at global batch %d", old_world, new_world,
                    new_global, batch_size, old_batch, int(state["num_batches"]))


class StreamBatchSampler:
    """Group a training sampler's indices into batches of ``(index, (seed, 0, global position))``.

    The key names the sample's position in the global stream (the rank field stays 0), so every
    sample is augmented alike for any number of workers, and exactly as in a one-worker run.
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
        seed, position = self.sampler.seed, self.sampler.start
        batch = []
        for index in self.sampler:
            batch.append((index, (seed, 0, self.sampler.global_position(position))))
            position += 1
            if len(batch) == self.batch_size:
                yield batch
                batch = []
