"""Models: backbones, heads, layers, losses and meta architectures.

`build_model(cfg)` is the entry point; the registries let new parts be added by name.
"""
from .backbones import BACKBONE_REGISTRY, build_backbone
from .deploy import fuse_for_deploy
from .heads import HEADS_REGISTRY, build_heads
from .layers import CLS_LAYER_REGISTRY, POOLING_REGISTRY
from .losses import LOSS_REGISTRY, build_losses
from .meta_arch import META_ARCH_REGISTRY, Baseline, build_model

__all__ = [
    "META_ARCH_REGISTRY", "BACKBONE_REGISTRY", "HEADS_REGISTRY", "LOSS_REGISTRY",
    "POOLING_REGISTRY", "CLS_LAYER_REGISTRY", "build_model", "build_backbone", "build_heads",
    "build_losses", "Baseline", "fuse_for_deploy",
]
