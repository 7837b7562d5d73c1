"""Head registry and builder (MODEL.HEADS.NAME)."""
from torch import nn

from reid_engine.utils.registry import Registry

__all__ = ["HEADS_REGISTRY", "build_heads"]

HEADS_REGISTRY = Registry("HEADS")
HEADS_REGISTRY.__doc__ = """
Heads by MODEL.HEADS.NAME: classes with a classmethod from_config(cfg). forward(features,
targets=None) returns the test feature (B, D) in eval mode and a dict of outputs
{"cls_outputs", "pred_class_logits", "features"} in training mode.
"""


def build_heads(cfg) -> nn.Module:
    """Build the head named by cfg.MODEL.HEADS.NAME.

    Args:
        cfg: the config tree.

    Returns:
        the head module.
    """
    name = cfg.MODEL.HEADS.NAME
    if name not in HEADS_REGISTRY:
        raise KeyError(f"MODEL.HEADS.NAME {name!r} is unknown; choose one of "
                       f"{', '.join(sorted(k for k, _ in HEADS_REGISTRY))}")
    return HEADS_REGISTRY.get(name).from_config(cfg)
