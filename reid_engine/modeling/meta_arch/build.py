"""Meta-architecture registry and `build_model` (MODEL.META_ARCHITECTURE, MODEL.DEVICE)."""
import logging

from torch import nn

from reid_engine.utils.env import resolve_device
from reid_engine.utils.registry import Registry

from .summary import log_model_summary

__all__ = ["META_ARCH_REGISTRY", "build_model"]

logger = logging.getLogger(__name__)

META_ARCH_REGISTRY = Registry("META_ARCH")
META_ARCH_REGISTRY.__doc__ = """
Meta architectures by MODEL.META_ARCHITECTURE: nn.Module classes with a classmethod
from_config(cfg). forward(batch dict) returns a dict of named losses in training mode
and features (B, D) in eval mode.
"""


def build_model(cfg) -> nn.Module:
    """Build the whole model, log its size and FLOPs (counted on the CPU), move it to MODEL.DEVICE.

    Args:
        cfg: the config tree.

    Returns:
        the model, in training mode, on the resolved device.
    """
    name = cfg.MODEL.META_ARCHITECTURE
    if name not in META_ARCH_REGISTRY:
        raise KeyError(f"MODEL.META_ARCHITECTURE {name!r} is unknown; choose one of "
                       f"{', '.join(sorted(k for k, _ in META_ARCH_REGISTRY))}")
    device = resolve_device(cfg.MODEL.DEVICE)
    model = META_ARCH_REGISTRY.get(name).from_config(cfg)
    # Counted while the model is still on the CPU: tracing on the training device would
    # leave its activations (and cudnn autotuning workspaces) in that device's memory.
    log_model_summary(model, tuple(cfg.INPUT.SIZE_TEST))
    model.to(device)
    logger.info("Built %s on %s", name, device)
    return model
