"""Head registry and builder (MODEL.HEADS.NAME)."""
from torch import nn

from reid_engine.utils.registry import Registry

__all__ = ["HEADS_REGISTRY", "build_heads"]

HEADS_REGISTRY = Registry("HEADS", key="MODEL.HEADS.NAME")
HEADS_REGISTRY.__doc__ = """
Heads by MODEL.HEADS.NAME (build contract: utils.registry): classes with a classmethod
from_config(cfg, in_channels), in_channels being the backbone's out_channels, and
optionally check_config(cfg). forward(features, targets=None) returns the test feature
(B, D) in eval mode and a dict of outputs {"cls_outputs", "pred_class_logits",
"features"} in training mode.
"""

def build_heads(cfg, in_channels: int) -> nn.Module:
    """Build the head named by cfg.MODEL.HEADS.NAME.

    Args:
        cfg: the config tree.
        in_channels: channels of the feature map the head receives (the backbone's
            `out_channels`).

    Returns:
        the head module.
    """
    return HEADS_REGISTRY.build(cfg.MODEL.HEADS.NAME, cfg, in_channels)
