"""Backbones: registry, builder and the backbone families."""
from .build import BACKBONE_REGISTRY, build_backbone
from .imagenet_weights import (
    WEIGHT_FAMILIES,
    PretrainPathError,
    WeightsFamily,
    WeightsFamilyError,
    load_imagenet_weights,
    register_weights_family,
)
from .resnest import RESNEST_DEPTHS, ResNeSt, build_resnest_backbone
from .resnet import RESNET_DEPTHS, BasicBlock, Bottleneck, ResNet, build_resnet_backbone
from .resnext import RESNEXT_DEPTHS, ResNeXt, build_resnext_backbone

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
    "RESNEST_DEPTHS",
    "ResNeSt",
    "build_resnest_backbone",
    "RESNEXT_DEPTHS",
    "ResNeXt",
    "build_resnext_backbone",
]
