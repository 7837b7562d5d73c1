"""Domain-balanced P x K sampling for multi-source training (domain generalisation).

A domain is one training set of ``DATASETS.NAMES``, identified by its position there. Each
worker's share of a batch takes its identities evenly from every domain, so a large source
(MSMT17) cannot crowd a small one (CUHK03) out of the batches, and losses or layers that
work per domain see every domain on every worker at every step.
"""

from typing import List, Optional, Sequence

import numpy as np

from reid_engine.config import ConfigError

from .identity import GroupPool, NaiveIdentitySampler, pids_per_set
from .registry import SAMPLER_REGISTRY

__all__ = ["DomainBalancedSampler"]


@SAMPLER_REGISTRY.register()
class DomainBalancedSampler(NaiveIdentitySampler):
    """P x K batches whose identities are split evenly over the training domains.

    A worker's share of a batch holds ``P_w = per-worker batch / K`` identities: ``P_w // D``
    from each of the D domains, and when D does not divide ``P_w`` the remaining
    ``P_w % D`` come from as many different domains drawn at random for each share (so
    domains differ by at most one id in a share, and are equal on average). The ids of a
    batch are distinct over all workers; within a share the groups are in domain order.
    Groups of K are those of :class:`NaiveIdentitySampler` (an id with fewer than K images
    is drawn with replacement). An epoch ends when some domain has fewer ids with groups
    left than the next batch takes from it; every domain's groups are then rebuilt. With a
    single domain the stream is exactly :class:`NaiveIdentitySampler`'s.

    Args:
        set_ids: the domain of every item (its set's position in DATASETS.NAMES, 0..D-1;
            ``None``: a single domain).
        others: see :class:`~reid_engine.data.samplers.IdentitySampler`.
    Raises:
        ConfigError: a share is too small to hold one id of every domain, or a domain has
            fewer ids than one batch takes from it.
    """

    extra_args = ("num_instances", "set_ids")

    def __init__(self, data_source, mini_batch_size: int, *,
                 set_ids: Optional[Sequence[int]] = None, **kwargs):
        super().__init__(data_source, mini_batch_size, **kwargs)
        if set_ids is None:  # built by hand without domains: one domain
            set_ids = np.zeros(self.num_items, dtype=np.int64)
        self.domain_pids: List[List[int]] = pids_per_set(self, set_ids)
        self.num_domains = len(self.domain_pids)
        self.ids_per_share = self.mini_batch_size // self.num_instances
        if self.ids_per_share < self.num_domains:
            raise ConfigError(
                f"DomainBalancedSampler: a worker's batch holds {self.ids_per_share} ids "
                f"(SOLVER.IMS_PER_BATCH {self.global_batch_size} / {self.world_size} worker(s) / "
                f"DATALOADER.NUM_INSTANCE {self.num_instances}), fewer than the "
                f"{self.num_domains} training sets in DATASETS.NAMES; raise SOLVER.IMS_PER_BATCH "
                f"or lower DATALOADER.NUM_INSTANCE")
        # A domain may give one extra id to every worker's share of the same batch.
        most = self.world_size * -(-self.ids_per_share // self.num_domains)
        for domain, pids in enumerate(self.domain_pids):
            if len(pids) < most:
                raise ConfigError(
                    f"DomainBalancedSampler: training set {domain} of DATASETS.NAMES has "
                    f"{len(pids)} ids but a batch may take {most} distinct ids from it; lower "
                    f"SOLVER.IMS_PER_BATCH, raise DATALOADER.NUM_INSTANCE or drop that set")

    def world_size_dependence(self) -> str:
        """With several domains every worker's share is balanced, so the stream follows the split."""
        if self.num_domains == 1:
            return ""
        return (f"{type(self).__name__} balances each worker's share over the {self.num_domains} training "
                f"sets, so its stream follows the number of workers")

    def share_quotas(self, rng: np.random.Generator) -> np.ndarray:
        """Return the ids each worker's share takes from each domain: int array (world, D)."""
        base, extra = divmod(self.ids_per_share, self.num_domains)
        quotas = np.full((self.world_size, self.num_domains), base, dtype=np.int64)
        if extra:  # no draw otherwise, so a single domain consumes rng like the naive sampler
            for share in quotas:
                share[rng.choice(self.num_domains, extra, replace=False)] += 1
        return quotas

    def epoch_indices(self, epoch: int) -> np.ndarray:
        rng = self.epoch_rng(epoch)
        pools = [GroupPool(self, pids, rng) for pids in self.domain_pids]
        groups: List[np.ndarray] = []
        while True:
            quotas = self.share_quotas(rng)
            drawn = [pool.draw(int(n)) for pool, n in zip(pools, quotas.sum(axis=0))]
            if any(domain_groups is None for domain_groups in drawn):
                return np.concatenate(groups)  # the first batch always fits (checked above)
            # Worker r takes the next quotas[r, d] groups of every domain d, in domain order.
            taken = [0] * self.num_domains
            for share in quotas.tolist():
                for domain, n in enumerate(share):
                    groups.extend(drawn[domain][taken[domain]:taken[domain] + n])
                    taken[domain] += n
