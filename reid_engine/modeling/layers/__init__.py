"""Building blocks shared by backbones and heads: norms, IBN, SE, non-local, pooling
and classifier layers."""
from .cls_layers import CLS_LAYER_REGISTRY, ArcSoftmax, CircleSoftmax, CosSoftmax, Linear, build_cls_layer
from .ibn import IBN
from .non_local import NonLocal
from .norm import NORM_NAMES, FrozenBatchNorm2d, GhostBatchNorm, get_norm
from .pooling import (
    POOLING_REGISTRY,
    AdaptiveAvgMaxPool,
    ClipGlobalAvgPool,
    Flatten,
    GeneralizedMeanPooling,
    GeneralizedMeanPoolingP,
    GlobalAvgPool,
    GlobalMaxPool,
    Identity,
    build_pooling,
)
from .se import SELayer
from .temporal_pool import TEMPORAL_POOLS, TemporalPool
from .weight_init import init_fan_out

__all__ = [
    "TEMPORAL_POOLS",
    "TemporalPool",
    "CLS_LAYER_REGISTRY",
    "ArcSoftmax",
    "CircleSoftmax",
    "CosSoftmax",
    "Linear",
    "build_cls_layer",
    "IBN",
    "NonLocal",
    "NORM_NAMES",
    "FrozenBatchNorm2d",
    "GhostBatchNorm",
    "get_norm",
    "POOLING_REGISTRY",
    "AdaptiveAvgMaxPool",
    "ClipGlobalAvgPool",
    "Flatten",
    "GeneralizedMeanPooling",
    "GeneralizedMeanPoolingP",
    "GlobalAvgPool",
    "GlobalMaxPool",
    "Identity",
    "build_pooling",
    "SELayer",
    "init_fan_out",
]
