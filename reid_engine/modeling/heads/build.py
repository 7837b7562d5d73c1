"""Head registry and builder (MODEL.HEADS.NAME)."""
from torch import nn

from reid_engine.utils.registry import Registry

__all__ = ["HEADS_REGISTRY", "build_heads", "check_heads_config"]

HEADS_REGISTRY = Registry("HEADS")
HEADS_REGISTRY.__doc__ = """
Heads by MODEL.HEADS.NAME (build contract: utils.registry): classes with a classmethod
from_config(cfg, in_channels), in_channels being the backbone's out_channels, and
optionally check_config(cfg). forward(features, targets=None) returns the test feature
(B, D) in eval mode and a dict of outputs {"cls_outputs", "pred_class_logits",
"features"} in training mode.
"""

_KEY = "MODEL.HEADS.NAME"


def check_heads_config(cfg) -> None:
    """Check MODEL.HEADS.NAME and the chosen head's own keys, building nothing.

    Args:
        cfg: the config tree.
    Raises:
        UnknownChoiceError: an unknown name or value (one line: key, choices, closest).
    """
    HEADS_REGISTRY.check_config(cfg.MODEL.HEADS.NAME, cfg, key=_KEY)


def build_heads(cfg, in_channels: int) -> nn.Module:
    """Build the head named by cfg.MODEL.HEADS.NAME.

    Args:
        cfg: the config tree.
        in_channels: channels of the feature map the head receives (the backbone's
            `out_channels`).

    Returns:
        the head module.
    """
    return HEADS_REGISTRY.build(cfg.MODEL.HEADS.NAME, cfg, in_channels, key=_KEY)
