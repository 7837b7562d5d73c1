"""The registry of training samplers, looked up by ``DATALOADER.SAMPLER_TRAIN``."""

from reid_engine.utils.registry import Registry

SAMPLER_REGISTRY = Registry("SAMPLER", key="DATALOADER.SAMPLER_TRAIN")
SAMPLER_REGISTRY.__doc__ = """
Training samplers by DATALOADER.SAMPLER_TRAIN (build contract: utils.registry).
``cls(data_source, mini_batch_size, *, seed, rank, world_size,
**extra)`` returns an infinite, rank-aware :class:`InfiniteSampler`; ``cls.extra_args`` names
the optional inputs the loader builder passes as ``extra`` (any of ``num_instances``,
``set_ids``, ``set_weight``).
"""
