"""Backbone registry and builder (MODEL.BACKBONE.NAME)."""
from torch import nn

from reid_engine.utils.registry import Registry

__all__ = ["BACKBONE_REGISTRY", "build_backbone"]

BACKBONE_REGISTRY = Registry("BACKBONE")
BACKBONE_REGISTRY.__doc__ = """
Backbones by MODEL.BACKBONE.NAME: functions fn(cfg) -> nn.Module that map images
(B, 3, H, W) to a feature map (B, C, h, w) and expose `out_channels` (C).
"""


def build_backbone(cfg) -> nn.Module:
    """Build the backbone named by cfg.MODEL.BACKBONE.NAME.

    Args:
        cfg: the config tree.

    Returns:
        nn.Module with attribute `out_channels`.
    """
    name = cfg.MODEL.BACKBONE.NAME
    if name not in BACKBONE_REGISTRY:
        raise KeyError(f"MODEL.BACKBONE.NAME {name!r} is unknown; choose one of "
                       f"{', '.join(sorted(k for k, _ in BACKBONE_REGISTRY))}")
    return BACKBONE_REGISTRY.get(name)(cfg)
