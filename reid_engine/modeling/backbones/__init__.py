"""Backbones: registry, builder, ImageNet-weights loading and the families."""
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
from .mobilenetv2 import MOBILENETV2_DEPTHS, MobileNetV2, build_mobilenetv2_backbone
from .mobilenetv3 import MOBILENETV3_DEPTHS, MobileNetV3, build_mobilenetv3_backbone
from .osnet import OSNET_DEPTHS, OSNet, build_osnet_backbone
from .regnet import REGNET_DEPTHS, RegNet, build_regnet_backbone
from .repvgg import REPVGG_DEPTHS, FusionError, RepVGG, RepVGGBlock, build_repvgg_backbone
from .resnest import RESNEST_DEPTHS, ResNeSt, build_resnest_backbone
from .resnet import RESNET_DEPTHS, BasicBlock, Bottleneck, ResNet, build_resnet_backbone
from .resnext import RESNEXT_DEPTHS, ResNeXt, build_resnext_backbone
from .shufflenetv2 import SHUFFLENETV2_DEPTHS, ShuffleNetV2, build_shufflenetv2_backbone
from .vit import VIT_DEPTHS, VisionTransformer, ViTSpec, build_vit_backbone

__all__ = [
    "BACKBONE_REGISTRY",
    "build_backbone",
    "WEIGHT_FAMILIES",
    "PretrainPathError",
    "WeightsFamily",
    "WeightsFamilyError",
    "load_imagenet_weights",
    "register_weights_family",
    "OSNET_DEPTHS",
    "OSNet",
    "build_osnet_backbone",
    "RESNET_DEPTHS",
    "BasicBlock",
    "Bottleneck",
    "ResNet",
    "build_resnet_backbone",
    "MOBILENETV2_DEPTHS",
    "MobileNetV2",
    "build_mobilenetv2_backbone",
    "MOBILENETV3_DEPTHS",
    "MobileNetV3",
    "build_mobilenetv3_backbone",
    "SHUFFLENETV2_DEPTHS",
    "ShuffleNetV2",
    "build_shufflenetv2_backbone",
    "REPVGG_DEPTHS",
    "FusionError",
    "RepVGG",
    "RepVGGBlock",
    "build_repvgg_backbone",
    "RESNEST_DEPTHS",
    "ResNeSt",
    "build_resnest_backbone",
    "RESNEXT_DEPTHS",
    "ResNeXt",
    "build_resnext_backbone",
    "REGNET_DEPTHS",
    "RegNet",
    "build_regnet_backbone",
    "EFFNET_DEPTHS",
    "EffNet",
    "build_effnet_backbone",
    "VIT_DEPTHS",
    "ViTSpec",
    "VisionTransformer",
    "build_vit_backbone",
]
