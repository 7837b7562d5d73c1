"""Image-level training samplers: plain shuffling and inverse-id-frequency sampling."""

import numpy as np

from .base import InfiniteSampler
from .registry import SAMPLER_REGISTRY

__all__ = ["TrainingSampler", "ImbalancedDatasetSampler"]


@SAMPLER_REGISTRY.register()
class TrainingSampler(InfiniteSampler):
    """Endless shuffling: each epoch is a fresh random permutation of all training images."""

    def epoch_indices(self, epoch: int) -> np.ndarray:
        return self.epoch_rng(epoch).permutation(self.num_items)

    def epoch_length(self, epoch: int) -> int:
        return self.num_items


@SAMPLER_REGISTRY.register()
class ImbalancedDatasetSampler(InfiniteSampler):
    """Draw images with replacement, each with probability proportional to 1 / (its id's size).

    Every identity is then drawn equally often on average, whatever its number of images.
    An epoch is ``len(data_source)`` draws.

    Args: see :class:`InfiniteSampler`.
    """

    def __init__(self, data_source, mini_batch_size, **kwargs):
        super().__init__(data_source, mini_batch_size, **kwargs)
        pids = np.fromiter((pid for _, pid, _ in data_source), dtype=np.int64,
                           count=len(data_source))
        _, inverse, counts = np.unique(pids, return_inverse=True, return_counts=True)
        weights = 1.0 / counts[inverse]
        self.probabilities = weights / weights.sum()

    def epoch_indices(self, epoch: int) -> np.ndarray:
        return self.epoch_rng(epoch).choice(self.num_items, size=self.num_items, replace=True,
                                            p=self.probabilities)

    def epoch_length(self, epoch: int) -> int:
        return self.num_items
