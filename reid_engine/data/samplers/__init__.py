"""Samplers: infinite, seeded, rank-aware, resumable training samplers and the test sharder."""

from .base import InferenceSampler, InfiniteSampler, resolve_rank
from .domain import DomainBalancedSampler
from .identity import BalancedIdentitySampler, IdentitySampler, NaiveIdentitySampler, SetReWeightSampler, apportion
from .registry import SAMPLER_REGISTRY
from .training import ImbalancedDatasetSampler, TrainingSampler

__all__ = [
    "SAMPLER_REGISTRY", "InfiniteSampler", "InferenceSampler", "TrainingSampler",
    "ImbalancedDatasetSampler", "IdentitySampler", "NaiveIdentitySampler",
    "BalancedIdentitySampler", "SetReWeightSampler", "DomainBalancedSampler", "apportion", "resolve_rank",
]
