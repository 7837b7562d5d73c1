"""Backbone registry and builder (MODEL.BACKBONE.NAME)."""
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.utils.registry import Registry

__all__ = ["BACKBONE_REGISTRY", "build_backbone", "check_backbone_options"]

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


# Variant switches of MODEL.BACKBONE that only some families have.
_VARIANT_KEYS = ("WITH_IBN", "WITH_NL", "WITH_SE")


def check_backbone_options(cfg, supported=()) -> None:
    """Check MODEL.BACKBONE.LAST_STRIDE and refuse WITH_IBN / WITH_NL / WITH_SE / WIDTH_MULT
    that the backbone named by MODEL.BACKBONE.NAME lacks, building nothing.

    Args:
        cfg: the config tree.
        supported: the variant keys this backbone implements, e.g. ("WITH_IBN",); a
            backbone without "WIDTH_MULT" accepts only WIDTH_MULT 1.0.

    Raises:
        ConfigError: a one-line message naming the key, the backbone and the fix.
    """
    opts = cfg.MODEL.BACKBONE
    if opts.LAST_STRIDE not in (1, 2):
        raise ConfigError(f"MODEL.BACKBONE.LAST_STRIDE must be 1 or 2, got {opts.LAST_STRIDE}")
    for key in _VARIANT_KEYS:
        if getattr(opts, key) and key not in supported:
            has = ", ".join(supported) if supported else "none of " + "/".join(_VARIANT_KEYS)
            raise ConfigError(f"MODEL.BACKBONE.{key} is True, but {opts.NAME} has no such variant "
                              f"(it has {has}); set {key} False or choose another backbone")
    if opts.WIDTH_MULT != 1.0 and "WIDTH_MULT" not in supported:
        raise ConfigError(f"MODEL.BACKBONE.WIDTH_MULT is {opts.WIDTH_MULT}, but {opts.NAME} has no "
                          f"width option (build_resnet_backbone has); set it to 1.0")
