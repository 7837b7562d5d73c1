"""Backbones: registry, builder and the ResNet family."""
from .build import BACKBONE_REGISTRY, build_backbone
from .imagenet_weights import (
    WEIGHT_FAMILIES,
    PretrainPathError,
    WeightsFamily,
    WeightsFamilyError,
    load_imagenet_weights,
    register_weights_family,
)
from .repvgg import REPVGG_DEPTHS, FusionError, RepVGG, RepVGGBlock, build_repvgg_backbone
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
    "REPVGG_DEPTHS",
    "FusionError",
    "RepVGG",
    "RepVGGBlock",
    "build_repvgg_backbone",
]
