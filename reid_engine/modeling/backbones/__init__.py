"""Backbones: registry, builder and the ResNet family."""
from .build import BACKBONE_REGISTRY, build_backbone
from .effnet import EFFNET_DEPTHS, EffNet, build_effnet_backbone
from .imagenet_weights import (
    WEIGHT_FAMILIES,
    PretrainPathError,
    WeightsFamily,
    WeightsFamilyError,
    load_imagenet_weights,
    register_weights_family,
)
from .regnet import REGNET_DEPTHS, RegNet, build_regnet_backbone
from .resnet import RESNET_DEPTHS, BasicBlock, Bottleneck, ResNet, build_resnet_backbone

__all__ = [
    "BACKBONE_REGISTRY",
    "build_backbone",
    "WEIGHT_FAMILIES",
    "PretrainPathError",
    "WeightsFamily",
    "WeightsFamilyError",
    "load_imagenet_weights",
    "register_weights_family",
    "RESNET_DEPTHS",
    "BasicBlock",
    "Bottleneck",
    "ResNet",
    "build_resnet_backbone",
    "REGNET_DEPTHS",
    "RegNet",
    "build_regnet_backbone",
    "EFFNET_DEPTHS",
    "EffNet",
    "build_effnet_backbone",
]
