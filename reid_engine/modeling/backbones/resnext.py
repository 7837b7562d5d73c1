"""ResNeXt family (50x / 101x / 152x, 32x4d) for ReID with last-stride, IBN-a and non-local
options, as fast-reid builds it.

The ResNet trunk with grouped bottlenecks (32 groups of 4 channels at planes 64, at every
depth), so the module names (and fast-reid's checkpoint keys) are the ResNet ones; the conv2
weights show the grouping: layer1.B.conv2.weight is (128, 4, 3, 3). Two details differ from
fast-reid's ResNet: the stem max-pool has padding 1 (floor mode), and IBN-a goes into bn1 of
every stage, layer4 included.
"""
from typing import Mapping, Sequence

from torch import Tensor, nn

from reid_engine.config import ConfigError
from reid_engine.utils.registry import check_choice, lookup

from ..layers import NORM_NAMES
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import WeightsFamily, load_imagenet_weights, register_weights_family
from .resnet import Bottleneck, ResNet

__all__ = ["ResNeXt", "RESNEXT_DEPTHS", "build_resnext_backbone"]

#: depth -> blocks per stage
RESNEXT_DEPTHS = {
    "50x": (3, 4, 6, 3),
    "101x": (3, 4, 23, 3),
    "152x": (3, 8, 36, 3),
}

# fast-reid's non-local layouts (blocks per stage); 152x has none defined.
_NON_LOCAL_PER_STAGE = {
    "50x": (0, 2, 3, 0),
    "101x": (0, 2, 3, 0),
}


class ResNeXt(ResNet):
    """ResNeXt trunk (fast-reid's): grouped bottlenecks, stem max-pool with padding 1,
    IBN-a in all four stages when asked for.

    Args:
        blocks_per_stage: number of blocks in layer1..layer4.
        cardinality: groups of every 3x3 conv.
        base_width: channels per group at planes 64 (doubling with each stage).
        last_stride, norm, with_ibn, non_local_per_stage: as ResNet.
    """

    def __init__(self, blocks_per_stage: Sequence[int], *, cardinality: int = 32, base_width: int = 4,
                 last_stride: int = 1, norm: str = "BN", with_ibn: bool = False,
                 non_local_per_stage: Sequence[int] = (0, 0, 0, 0)):
        super().__init__(Bottleneck, blocks_per_stage, last_stride=last_stride, norm=norm, with_ibn=with_ibn,
                         non_local_per_stage=non_local_per_stage, ibn_stages=(1, 2, 3, 4),
                         block_options={"groups": cardinality, "width_per_group": base_width},
                         stem_pool=nn.MaxPool2d(kernel_size=3, stride=2, padding=1))


def check_resnext_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (a ResNeXt depth), NORM, LAST_STRIDE and the variants
    (IBN-a, non-local where fast-reid defines it), building nothing."""
    opts = cfg.MODEL.BACKBONE
    lookup(RESNEXT_DEPTHS, opts.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, ("WITH_IBN", "WITH_NL"))
    check_choice(opts.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")
    if opts.WITH_NL and opts.DEPTH not in _NON_LOCAL_PER_STAGE:
        raise ConfigError(f"MODEL.BACKBONE.WITH_NL: ResNeXt non-local blocks are defined for depths "
                          f"{', '.join(_NON_LOCAL_PER_STAGE)}, not {opts.DEPTH}; "
                          "set WITH_NL False or change DEPTH")


@BACKBONE_REGISTRY.register()
def build_resnext_backbone(cfg) -> ResNeXt:
    """Build a ResNeXt (32x4d) from MODEL.BACKBONE.{DEPTH, LAST_STRIDE, NORM, WITH_IBN,
    WITH_NL, PRETRAIN, PRETRAIN_PATH}.

    Args:
        cfg: the config tree.

    Returns:
        ResNeXt with `out_channels` 2048.
    """
    opts = cfg.MODEL.BACKBONE
    check_resnext_config(cfg)
    non_local = _NON_LOCAL_PER_STAGE[opts.DEPTH] if opts.WITH_NL else (0, 0, 0, 0)
    model = ResNeXt(RESNEXT_DEPTHS[opts.DEPTH], last_stride=opts.LAST_STRIDE, norm=opts.NORM,
                    with_ibn=opts.WITH_IBN, non_local_per_stage=non_local)
    if opts.PRETRAIN:
        load_imagenet_weights(model, opts.PRETRAIN_PATH, "ResNeXt")
    return model


build_resnext_backbone.check_config = check_resnext_config


def _is_resnext(state: Mapping[str, Tensor]) -> bool:
    # torchvision's ResNet names with a grouped 3x3: each group sees fewer input channels
    # than the conv has outputs (ResNet's conv2 is dense).
    if "conv1.weight" not in state or "layer1.0.conv1.weight" not in state:
        return False
    conv2 = state["layer1.0.conv2.weight"]
    return conv2.dim() == 4 and conv2.shape[1] < conv2.shape[0]


# torchvision's, timm's and IBN-Net's releases share the ResNet names: nothing to rename.
register_weights_family(WeightsFamily(
    name="ResNeXt", fingerprint=_is_resnext, dropped_prefixes=("fc.",),
    releases="torchvision / timm resnext*_32x4d or IBN-Net resnext101_ibn_a"))
