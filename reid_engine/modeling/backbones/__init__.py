"""Backbones: registry, builder and the ResNet family."""
from .build import BACKBONE_REGISTRY, build_backbone
from .pretrained import PretrainLoadResult, load_pretrained_weights
from .resnet import RESNET_DEPTHS, BasicBlock, Bottleneck, ResNet, build_resnet_backbone

__all__ = [
    "BACKBONE_REGISTRY",
    "build_backbone",
    "PretrainLoadResult",
    "load_pretrained_weights",
    "RESNET_DEPTHS",
    "BasicBlock",
    "Bottleneck",
    "ResNet",
    "build_resnet_backbone",
]
