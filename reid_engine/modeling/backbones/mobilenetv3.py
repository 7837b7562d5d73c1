"""MobileNetV3 Large / Small (Howard et al., 2019) for ReID, as fast-reid builds it.

fast-reid takes torchvision's MobileNetV3 feature trunk (`features.*`: hard-swish stem,
inverted residual blocks `features.N.block.U.{0,1}` with ReLU or hard-swish and a hard-sigmoid
squeeze-excitation `block.U.fc1` / `fc2`, and a last 1x1 conv to 6x the last block's width
with hard-swish) and adds a 1x1 conv-norm-ReLU6 `conv.{0,1}` to 1280 (Large) / 1024 (Small)
channels: the width torchvision's classifier has in its first linear layer. So torchvision's
ImageNet files load unrenamed except `conv`, which no release holds (it stays initialised, as
in fast-reid); timm's files (`conv_stem`, `blocks.S.B.*`) are renamed.

The output stride is 32 whatever MODEL.BACKBONE.LAST_STRIDE says: fast-reid's MobileNetV3 has
no last-stride option (a 256x128 image gives an 8x4 map).
"""
from typing import Mapping, Optional, Sequence, Tuple, Type

from torch import Tensor, nn
from torch.nn import functional as F

from reid_engine.utils.registry import check_choice, lookup

from ..layers import NORM_NAMES, init_fan_out
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import StateDict, WeightsFamily, load_imagenet_weights, register_weights_family
from .mobile_blocks import conv_norm_act, make_divisible, rename_timm_mobilenet, timm_stage_depths

__all__ = ["MOBILENETV3_DEPTHS", "HardSqueezeExcitation", "MobileNetV3Block", "MobileNetV3",
           "build_mobilenetv3_backbone"]

# A block: (kernel, expanded channels, output channels, squeeze-excitation, hard-swish, stride);
# "RE" / "HS" in the paper's tables become hard-swish False / True.
BlockSpec = Tuple[int, int, int, bool, bool, int]

_LARGE_BLOCKS: Tuple[BlockSpec, ...] = (
    (3, 16, 16, False, False, 1),
    (3, 64, 24, False, False, 2),
    (3, 72, 24, False, False, 1),
    (5, 72, 40, True, False, 2),
    (5, 120, 40, True, False, 1),
    (5, 120, 40, True, False, 1),
    (3, 240, 80, False, True, 2),
    (3, 200, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 480, 112, True, True, 1),
    (3, 672, 112, True, True, 1),
    (5, 672, 160, True, True, 2),
    (5, 960, 160, True, True, 1),
    (5, 960, 160, True, True, 1),
)
_SMALL_BLOCKS: Tuple[BlockSpec, ...] = (
    (3, 16, 16, True, False, 2),
    (3, 72, 24, False, False, 2),
    (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2),
    (5, 240, 40, True, True, 1),
    (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1),
    (5, 144, 48, True, True, 1),
    (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1),
    (5, 576, 96, True, True, 1),
)
_STEM_CHANNELS = 16

#: DEPTH -> (blocks, output channels of the last conv)
MOBILENETV3_DEPTHS = {"Large": (_LARGE_BLOCKS, 1280), "Small": (_SMALL_BLOCKS, 1024)}


class HardSqueezeExcitation(nn.Module):
    """Squeeze-excitation with 1x1 convs `fc1` / `fc2` (with biases), ReLU between and a
    hard-sigmoid gate; the squeeze width is channels / 4 rounded to a multiple of 8.

    Args:
        channels: channels of the input.
    """

    def __init__(self, channels: int):
        super().__init__()
        squeezed = make_divisible(channels // 4, 8)
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        """Return x (B, C, H, W) scaled by its per-channel gate in [0, 1]."""
        gate = self.fc2(self.relu(self.fc1(F.adaptive_avg_pool2d(x, 1))))
        return x * F.hardsigmoid(gate)


class MobileNetV3Block(nn.Module):
    """Inverted residual of MobileNetV3: 1x1 expansion (where the width changes), depthwise
    conv (carrying the stride), optional squeeze-excitation, linear 1x1 projection; identity
    shortcut where shapes allow. Layers are `block.0`, `block.1`, ... in that order.

    Args:
        in_channels: channels in.
        spec: (kernel, expanded, out channels, squeeze-excitation, hard-swish, stride).
        norm: norm name for get_norm.
    """

    def __init__(self, in_channels: int, spec: BlockSpec, norm: str):
        super().__init__()
        kernel, expanded, out_channels, with_se, hard_swish, stride = spec
        activation: Type[nn.Module] = nn.Hardswish if hard_swish else nn.ReLU
        layers = []
        if expanded != in_channels:
            layers.append(conv_norm_act(in_channels, expanded, 1, norm=norm, activation=activation))
        layers.append(conv_norm_act(expanded, expanded, kernel, stride, groups=expanded, norm=norm,
                                    activation=activation))
        if with_se:
            layers.append(HardSqueezeExcitation(expanded))
        layers.append(conv_norm_act(expanded, out_channels, 1, norm=norm, activation=None))
        self.block = nn.Sequential(*layers)
        self.use_shortcut = stride == 1 and in_channels == out_channels

    def forward(self, x: Tensor) -> Tensor:
        """Return block(x), plus x where the block keeps the shape."""
        out = self.block(x)
        return x + out if self.use_shortcut else out


class MobileNetV3(nn.Module):
    """MobileNetV3 trunk plus fast-reid's 1x1 conv (no classifier), at stride 32.

    Args:
        blocks: the block specs (see BlockSpec).
        out_channels: channels of the last conv (`conv`).
        norm: norm name for every norm layer.
    """

    def __init__(self, blocks: Sequence[BlockSpec], out_channels: int, norm: str = "BN"):
        super().__init__()
        layers = [conv_norm_act(3, _STEM_CHANNELS, 3, 2, norm=norm, activation=nn.Hardswish)]
        channels = _STEM_CHANNELS
        for spec in blocks:
            layers.append(MobileNetV3Block(channels, spec, norm))
            channels = spec[2]
        layers.append(conv_norm_act(channels, 6 * channels, 1, norm=norm, activation=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        # fast-reid's addition (ReLU6, not torchvision's classifier hard-swish)
        self.conv = conv_norm_act(6 * channels, out_channels, 1, norm=norm, activation=nn.ReLU6)
        self.out_channels = out_channels
        init_fan_out(self)

    def forward(self, x: Tensor) -> Tensor:
        """Map images (B, 3, H, W) to (B, out_channels, ceil(H/32), ceil(W/32))."""
        return self.conv(self.features(x))


# ----------------------------------------------------------------------------- ImageNet weights
def _our_unit_name(block: int, unit: Optional[int], kind: str) -> Optional[str]:
    """Our name of a layer in timm's numbering (see mobile_blocks.UnitNamer), None for a layer we
    have not; timm's head conv (with a bias and no norm) is no layer of ours and never asked for."""
    layer = {"conv": "0", "norm": "1", "se_reduce": "fc1", "se_expand": "fc2"}.get(kind)
    if layer is None:
        return None
    if unit is None:  # the stem or timm's last conv-norm-act block: features.N.{0,1}
        return f"features.{block}.{layer}"
    return f"features.{block}.block.{unit}.{layer}"


# timm's mobilenetv3_large_* / _small_* stages hold these blocks (its other nets differ).
_TIMM_STAGE_DEPTHS = {(1, 2, 3, 4, 2, 3, 1), (1, 2, 3, 2, 3, 1)}


def rename_mobilenetv3_weights(state: StateDict) -> StateDict:
    """An ImageNet MobileNetV3 file's keys -> ours: timm's renamed, torchvision's (and
    fast-reid's) kept (they are ours)."""
    if "conv_stem.weight" in state:
        return rename_timm_mobilenet(state, _our_unit_name)
    return state


def is_mobilenetv3_file(state: Mapping[str, Tensor]) -> bool:
    """True for a MobileNetV3 file of torchvision / fast-reid or timm."""
    if "conv_stem.weight" in state:
        return timm_stage_depths(state) in _TIMM_STAGE_DEPTHS
    return "features.0.0.weight" in state and "features.1.block.0.0.weight" in state


register_weights_family(WeightsFamily(
    name="MobileNetV3", fingerprint=is_mobilenetv3_file, rename=rename_mobilenetv3_weights,
    # torchvision's classifier (its first layer is the 1280 / 1024 linear), timm's head conv
    dropped_prefixes=("classifier.", "conv_head."), releases="torchvision or timm"))


# ----------------------------------------------------------------------------- builder
def check_mobilenetv3_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (Large / Small), NORM, LAST_STRIDE and that no WITH_IBN /
    WITH_SE / WITH_NL is asked for, building nothing."""
    lookup(MOBILENETV3_DEPTHS, cfg.MODEL.BACKBONE.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, supported=())
    check_choice(cfg.MODEL.BACKBONE.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")


@BACKBONE_REGISTRY.register()
def build_mobilenetv3_backbone(cfg) -> MobileNetV3:
    """Build a MobileNetV3 from MODEL.BACKBONE.{DEPTH, NORM, PRETRAIN, PRETRAIN_PATH}
    (LAST_STRIDE is checked but, as in fast-reid, changes nothing: the output stride is 32).

    Args:
        cfg: the config tree.

    Returns:
        MobileNetV3 with `out_channels` 1280 (Large) or 1024 (Small).
    """
    opts = cfg.MODEL.BACKBONE
    check_mobilenetv3_config(cfg)
    blocks, out_channels = MOBILENETV3_DEPTHS[opts.DEPTH]
    model = MobileNetV3(blocks, out_channels, norm=opts.NORM)
    if opts.PRETRAIN:
        load_imagenet_weights(model, opts.PRETRAIN_PATH, "MobileNetV3")
    return model


build_mobilenetv3_backbone.check_config = check_mobilenetv3_config
