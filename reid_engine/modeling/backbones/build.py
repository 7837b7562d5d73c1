"""Backbone registry and builder (MODEL.BACKBONE.NAME)."""
from torch import nn

from reid_engine.utils.registry import Registry, check_choice

from ..layers import NORM_NAMES

__all__ = ["BACKBONE_REGISTRY", "build_backbone", "check_backbone_config"]

BACKBONE_REGISTRY = Registry("BACKBONE")
BACKBONE_REGISTRY.__doc__ = """
Backbones by MODEL.BACKBONE.NAME (build contract: utils.registry): functions fn(cfg) ->
nn.Module that map images (B, 3, H, W) to a feature map (B, C, h, w) and expose an int
`out_channels` (C); fn.check_config(cfg), where present, validates fn's keys.
"""

_KEY = "MODEL.BACKBONE.NAME"


def check_backbone_config(cfg) -> None:
    """Check MODEL.BACKBONE.NAME, NORM and the chosen backbone's own keys, building nothing.

    Args:
        cfg: the config tree.
    Raises:
        UnknownChoiceError: an unknown name or value (one line: key, choices, closest).
    """
    BACKBONE_REGISTRY.check_config(cfg.MODEL.BACKBONE.NAME, cfg, key=_KEY)
    check_choice(cfg.MODEL.BACKBONE.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")


def build_backbone(cfg) -> nn.Module:
    """Build the backbone named by cfg.MODEL.BACKBONE.NAME.

    Args:
        cfg: the config tree.

    Returns:
        nn.Module with an int attribute `out_channels`, the channels of its output map.
    """
    return BACKBONE_REGISTRY.build(cfg.MODEL.BACKBONE.NAME, cfg, key=_KEY)
