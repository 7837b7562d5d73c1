"""Identity (P x K) samplers: every global batch holds P distinct ids with K images each.

A batch is a run of P groups of K consecutive indices of one id. Since each rank's share of
a global batch is a multiple of K, every rank receives whole groups, and as the P ids of a
batch are distinct, ranks never see the same id in one step.
"""

from collections import deque
from typing import Dict, List, Optional, Sequence

import numpy as np

from reid_engine.config import ConfigError

from .base import InfiniteSampler
from .registry import SAMPLER_REGISTRY

__all__ = ["IdentitySampler", "NaiveIdentitySampler", "BalancedIdentitySampler",
           "SetReWeightSampler", "apportion", "pids_per_set"]


class IdentitySampler(InfiniteSampler):
    """Base of the P x K samplers: ids, their images and cameras; groups come from subclasses.

    Args:
        data_source: the training items ``(img_path, pid, camid)``.
        mini_batch_size: images per batch on this rank (a multiple of ``num_instances``).
        num_instances: K, images per identity in a batch.
        seed, rank, world_size: see :class:`InfiniteSampler`.
    Raises:
        ConfigError: the batch is not a multiple of K, or there are fewer ids than a batch needs.
    """

    extra_args = ("num_instances",)

    def __init__(self, data_source, mini_batch_size: int, *, num_instances: int = 4, **kwargs):
        super().__init__(data_source, mini_batch_size, **kwargs)
        k = int(num_instances)
        if k < 1 or self.mini_batch_size % k:
            raise ConfigError(
                f"{type(self).__name__}: the per-worker batch ({self.mini_batch_size}) must be "
                f"a positive multiple of the images per id ({k}); change SOLVER.IMS_PER_BATCH "
                f"or DATALOADER.NUM_INSTANCE")
        self.num_instances = k
        self.ids_per_batch = self.global_batch_size // k
        pids = np.array([pid for _, pid, _ in data_source], dtype=np.int64)
        self.camids = np.array([camid for _, _, camid in data_source], dtype=np.int64)
        order = np.argsort(pids, kind="stable")
        unique, starts = np.unique(pids[order], return_index=True)
        self.pids: List[int] = unique.tolist()
        self.pid_indices: Dict[int, np.ndarray] = {
            pid: chunk for pid, chunk in zip(self.pids, np.split(order, starts[1:]))}
        if len(self.pids) < self.ids_per_batch:
            raise ConfigError(
                f"{type(self).__name__}: a batch of {self.global_batch_size} images with {k} "
                f"per id needs {self.ids_per_batch} identities but the training set has only "
                f"{len(self.pids)}; lower SOLVER.IMS_PER_BATCH or raise DATALOADER.NUM_INSTANCE")

    def pid_groups(self, pid: int, rng: np.random.Generator) -> List[np.ndarray]:
        """Return this epoch's groups of K indices for ``pid`` (at least one group)."""
        raise NotImplementedError

    def _chunk(self, sequence: np.ndarray, indices: np.ndarray,
               rng: np.random.Generator) -> List[np.ndarray]:
        """Cut ``sequence`` into groups of K; an id with fewer than K images is topped up by
        drawing its images again with replacement. A trailing partial group is dropped."""
        k = self.num_instances
        if len(sequence) < k:
            sequence = np.concatenate([sequence, rng.choice(indices, k - len(sequence))])
        return [sequence[i:i + k] for i in range(0, len(sequence) - k + 1, k)]


class GroupPool:
    """Per-id queues of K-index groups from which batches of distinct ids are drawn.

    Args:
        sampler: supplies ``pid_groups(pid, rng)``.
        pids: the ids of this pool (sorted, for determinism).
        rng: the epoch generator.
        refill: when fewer ids than requested have groups left, regenerate all groups
            instead of reporting exhaustion.
    """

    def __init__(self, sampler: IdentitySampler, pids: Sequence[int], rng: np.random.Generator,
                 refill: bool = False):
        self.sampler, self.pids, self.rng, self.refill = sampler, list(pids), rng, refill
        self._fill()

    def _fill(self) -> None:
        self.queues = {pid: deque(self.sampler.pid_groups(pid, self.rng)) for pid in self.pids}
        self.available = [pid for pid in self.pids if self.queues[pid]]

    def draw(self, n: int) -> Optional[List[np.ndarray]]:
        """Return ``n`` groups of ``n`` distinct ids in random order, or ``None`` if exhausted."""
        if len(self.available) < n:
            if not self.refill:
                return None
            self._fill()
        chosen = self.rng.choice(len(self.available), n, replace=False)
        groups, emptied = [], []
        for position in chosen.tolist():
            queue = self.queues[self.available[position]]
            groups.append(queue.popleft())
            if not queue:
                emptied.append(position)
        for position in sorted(emptied, reverse=True):
            del self.available[position]
        return groups


@SAMPLER_REGISTRY.register()
class NaiveIdentitySampler(IdentitySampler):
    """P x K batches: each id's images shuffled and cut into groups of K (ids with fewer than K
    images are drawn with replacement); batches take groups of P random distinct ids until
    fewer than P ids have groups left, which ends the epoch."""

    def pid_groups(self, pid, rng):
        indices = self.pid_indices[pid]
        return self._chunk(rng.permutation(indices), indices, rng)

    def epoch_indices(self, epoch: int) -> np.ndarray:
        rng = self.epoch_rng(epoch)
        pool = GroupPool(self, self.pids, rng)
        groups: List[np.ndarray] = []
        while True:
            batch = pool.draw(self.ids_per_batch)
            if batch is None:
                return np.concatenate(groups)
            groups.extend(batch)


@SAMPLER_REGISTRY.register()
class BalancedIdentitySampler(NaiveIdentitySampler):
    """P x K batches whose K images of an id come from different cameras where possible.

    Each id's images are ordered round-robin over its cameras (cameras and images within a
    camera shuffled), so a group of K spans min(K, number of cameras) cameras while the id
    has images left in them.
    """

    def pid_groups(self, pid, rng):
        indices = self.pid_indices[pid]
        shuffled = rng.permutation(indices)
        cams = self.camids[shuffled]
        cam_rank = {cam: r for r, cam in enumerate(rng.permutation(np.unique(cams)).tolist())}
        seen: Dict[int, int] = {}
        keys = []
        for cam in cams.tolist():
            turn = seen.get(cam, 0)
            seen[cam] = turn + 1
            keys.append(turn * len(cam_rank) + cam_rank[cam])  # round, then camera
        return self._chunk(shuffled[np.argsort(keys, kind="stable")], indices, rng)


def pids_per_set(sampler: IdentitySampler, set_ids: Optional[Sequence[int]]) -> List[List[int]]:
    """Group a P x K sampler's identities by the training set (domain) of their images.

    Args:
        sampler: the sampler (its ``pids``, ``pid_indices`` and ``num_items``).
        set_ids: the training set of every item (0..S-1, aligned with the items): its
            position in DATASETS.NAMES.
    Returns:
        For each set 0..S-1, its ids in sorted order.
    Raises:
        ValueError: ``set_ids`` is missing or not one per item, or an id spans two sets.
    """
    name = type(sampler).__name__
    if set_ids is None:
        raise ValueError(f"{name} needs the training set of every item (set_ids); build it "
                         f"through build_reid_train_loader")
    set_ids = np.asarray(set_ids, dtype=np.int64)
    if set_ids.shape != (sampler.num_items,):
        raise ValueError(f"{name}: {set_ids.size} set ids for {sampler.num_items} items")
    groups: List[List[int]] = [[] for _ in range(int(set_ids.max()) + 1)]
    for pid in sampler.pids:  # sorted, so every group is sorted
        sets = np.unique(set_ids[sampler.pid_indices[pid]])
        if len(sets) > 1:
            raise ValueError(f"{name}: identity {pid} spans several training sets; merged sets "
                             f"must keep their ids apart")
        groups[int(sets[0])].append(pid)
    return groups


def apportion(total: int, weights: Sequence[float]) -> List[int]:
    """Split ``total`` into integer shares proportional to ``weights`` (largest remainder).

    Args:
        total: the amount to split.
        weights: non-negative weights with a positive sum.
    Returns:
        Integer shares summing to ``total``.
    """
    w = np.asarray(weights, dtype=np.float64)
    exact = total * w / w.sum()
    shares = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - shares), kind="stable")
    shares[order[:total - int(shares.sum())]] += 1
    return shares.tolist()


@SAMPLER_REGISTRY.register()
class SetReWeightSampler(NaiveIdentitySampler):
    """P x K batches over several merged training sets, with ids per batch split by set weight.

    Each batch takes ``apportion(P, set_weight)`` distinct ids from each set (groups as in
    :class:`NaiveIdentitySampler`, pools refilled when a set runs out), so a small set is
    seen as often as its weight says rather than as often as its size says. An epoch is
    ``len(data_source) // global batch`` batches (at least one).

    Args:
        set_ids: the training set of every item (0..S-1, aligned with ``data_source``).
        set_weight: one non-negative weight per set (empty: equal weights).
        others: see :class:`IdentitySampler`.
    """

    extra_args = ("num_instances", "set_ids", "set_weight")

    def __init__(self, data_source, mini_batch_size: int, *,
                 set_ids: Optional[Sequence[int]] = None, set_weight: Sequence[float] = (),
                 **kwargs):
        super().__init__(data_source, mini_batch_size, **kwargs)
        self.set_pids = pids_per_set(self, set_ids)
        num_sets = len(self.set_pids)
        weights = list(set_weight) or [1.0] * num_sets
        if len(weights) != num_sets or min(weights) < 0 or sum(weights) <= 0:
            raise ConfigError(
                f"DATALOADER.SET_WEIGHT must hold {num_sets} non-negative weights (one per "
                f"training set in DATASETS.NAMES) with a positive sum, got {list(set_weight)}")
        self.set_weight = [float(w) for w in weights]
        self.set_quota = apportion(self.ids_per_batch, self.set_weight)
        for s, pids in enumerate(self.set_pids):
            if len(pids) < self.set_quota[s]:
                raise ConfigError(
                    f"SetReWeightSampler: training set {s} has {len(pids)} ids but its weight "
                    f"asks for {self.set_quota[s]} per batch; lower its DATALOADER.SET_WEIGHT "
                    f"or SOLVER.IMS_PER_BATCH")
        self.batches_per_epoch = max(1, self.num_items // self.global_batch_size)

    def epoch_indices(self, epoch: int) -> np.ndarray:
        rng = self.epoch_rng(epoch)
        pools = [(GroupPool(self, pids, rng, refill=True), quota)
                 for pids, quota in zip(self.set_pids, self.set_quota) if quota > 0]
        groups: List[np.ndarray] = []
        for _ in range(self.batches_per_epoch):
            batch = [g for pool, quota in pools for g in pool.draw(quota)]
            groups.extend(batch[i] for i in rng.permutation(len(batch)).tolist())
        return np.concatenate(groups)

    def epoch_length(self, epoch: int) -> int:
        return self.batches_per_epoch * self.global_batch_size
