"""Backbones: registry, builder and the ResNet family."""
from .build import BACKBONE_REGISTRY, build_backbone
from .resnet import RESNET_DEPTHS, BasicBlock, Bottleneck, ResNet, build_resnet_backbone
from .resnet_weights import PretrainPathError, load_imagenet_weights

__all__ = [
    "BACKBONE_REGISTRY",
    "build_backbone",
    "PretrainPathError",
    "load_imagenet_weights",
    "RESNET_DEPTHS",
    "BasicBlock",
    "Bottleneck",
    "ResNet",
    "build_resnet_backbone",
]
