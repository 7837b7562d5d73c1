"""Backbone registry and builder (MODEL.BACKBONE.NAME)."""
from torch import nn

from reid_engine.utils.registry import Registry

__all__ = ["BACKBONE_REGISTRY", "build_backbone"]

BACKBONE_REGISTRY = Registry("BACKBONE", key="MODEL.BACKBONE.NAME")
BACKBONE_REGISTRY.__doc__ = """
Backbones by MODEL.BACKBONE.NAME (build contract: utils.registry): functions fn(cfg) ->
nn.Module that map images (B, 3, H, W) to a feature map (B, C, h, w) and expose an int
`out_channels` (C); fn.check_config(cfg), where present, validates fn's keys.
"""

def build_backbone(cfg) -> nn.Module:
    """Build the backbone named by cfg.MODEL.BACKBONE.NAME.

    Args:
        cfg: the config tree.

    Returns:
        nn.Module with an int attribute `out_channels`, the channels of its output map.
    """
    return BACKBONE_REGISTRY.build(cfg.MODEL.BACKBONE.NAME, cfg)
