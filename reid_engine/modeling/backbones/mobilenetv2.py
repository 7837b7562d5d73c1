"""MobileNetV2 (Sandler et al., 2018) for ReID, widths 1.0x down to 0.1x, as fast-reid builds it.

Module names give fast-reid's keys (those of the tonylins/pytorch-mobilenet-v2 port):
`features.0.{0,1}` the stem, `features.N.conv.{0,1,3,4,6,7}` the inverted residual blocks
(a flat sequence; {0,1,3,4} for the first block, which has no expansion conv), and
`conv.{0,1}` the last 1x1 conv. ImageNet files of torchvision (`features.N.conv.U.{0,1}`,
`features.18`) and of timm (`conv_stem`, `blocks.S.B.*`, `conv_head` / `bn2`) are renamed.

The output stride is 32 whatever MODEL.BACKBONE.LAST_STRIDE says: fast-reid's MobileNetV2 has
no last-stride option (a 256x128 image gives an 8x4 map).
"""
from typing import Mapping, Optional

from torch import Tensor, nn

from reid_engine.utils.registry import check_choice, lookup

from ..layers import NORM_NAMES, init_fan_out
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import StateDict, WeightsFamily, load_imagenet_weights, register_weights_family
from .mobile_blocks import conv_norm_act, make_divisible, rename_timm_mobilenet, timm_stage_depths

__all__ = ["MOBILENETV2_DEPTHS", "InvertedResidual", "MobileNetV2", "build_mobilenetv2_backbone"]

#: DEPTH -> width multiplier
MOBILENETV2_DEPTHS = {"1.0x": 1.0, "0.75x": 0.75, "0.5x": 0.5, "0.35x": 0.35, "0.25x": 0.25, "0.1x": 0.1}

# (expansion, output channels at 1.0x, blocks, stride of the first block) of each stage
_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
_STEM_CHANNELS = 32
# The last conv keeps 1280 channels at every width <= 1.0x (fast-reid widens it only above 1.0x,
# which has no DEPTH string).
_LAST_CHANNELS = 1280


class InvertedResidual(nn.Module):
    """Expand by a 1x1 conv, filter by a 3x3 depthwise conv (carrying the stride), project by a
    linear 1x1 conv; identity shortcut where shapes allow. ReLU6 activations.

    Args:
        in_channels, out_channels: channels in and out.
        stride: stride of the depthwise conv.
        expansion: hidden channels = in_channels x expansion (no expansion conv when 1).
        norm: norm name for get_norm.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int, norm: str):
        super().__init__()
        hidden = in_channels * expansion
        expand = conv_norm_act(in_channels, hidden, 1, norm=norm, activation=nn.ReLU6) if expansion != 1 else []
        # one flat sequence, so the keys are fast-reid's conv.0 ... conv.7
        self.conv = nn.Sequential(
            *expand,
            *conv_norm_act(hidden, hidden, 3, stride, groups=hidden, norm=norm, activation=nn.ReLU6),
            *conv_norm_act(hidden, out_channels, 1, norm=norm, activation=None),
        )
        self.use_shortcut = stride == 1 and in_channels == out_channels

    def forward(self, x: Tensor) -> Tensor:
        """Return conv(x), plus x where the block keeps the shape."""
        out = self.conv(x)
        return x + out if self.use_shortcut else out


class MobileNetV2(nn.Module):
    """MobileNetV2 trunk (no classifier) returning the last 1x1 conv's map at stride 32.

    Args:
        width_mult: width multiplier of every layer but the last conv (1280 channels).
        norm: norm name for every norm layer.
    """

    def __init__(self, width_mult: float = 1.0, norm: str = "BN"):
        super().__init__()
        # fast-reid rounds the 0.1x widths to multiples of 4 (8 would inflate them), others to 8.
        divisor = 4 if width_mult == 0.1 else 8
        channels = make_divisible(_STEM_CHANNELS * width_mult, divisor)
        layers = [conv_norm_act(3, channels, 3, 2, norm=norm, activation=nn.ReLU6)]
        for expansion, base_channels, blocks, stride in _STAGES:
            out_channels = make_divisible(base_channels * width_mult, divisor)
            for index in range(blocks):
                layers.append(InvertedResidual(channels, out_channels, stride if index == 0 else 1, expansion, norm))
                channels = out_channels
        self.features = nn.Sequential(*layers)
        self.conv = conv_norm_act(channels, _LAST_CHANNELS, 1, norm=norm, activation=nn.ReLU6)
        self.out_channels = _LAST_CHANNELS
        init_fan_out(self)

    def forward(self, x: Tensor) -> Tensor:
        """Map images (B, 3, H, W) to (B, 1280, ceil(H/32), ceil(W/32))."""
        return self.conv(self.features(x))


# ----------------------------------------------------------------------------- ImageNet weights
def _our_unit_name(block: int, unit: Optional[int], kind: str) -> Optional[str]:
    """Our name of a conv / norm in timm's numbering (see mobile_blocks.UnitNamer); None for a
    squeeze-excitation, which MobileNetV2 has not (a file with one is another net's)."""
    if kind not in ("conv", "norm"):
        return None
    layer = {"conv": 0, "norm": 1}[kind]
    if block == 0:
        return f"features.0.{layer}"
    if block == -1:
        return f"conv.{layer}"
    return f"features.{block}.conv.{3 * unit + layer}"


def _rename_torchvision(state: StateDict) -> StateDict:
    """torchvision's keys -> ours: conv-norm-act units `conv.U.{0,1}` become the flat
    `conv.{3U,3U+1}`, the trailing linear conv / norm `conv.{U,U+1}` move up to
    `conv.{3U,3U+1}`, and the last feature (the 1280 conv) becomes `conv`."""
    last = max(int(key.split(".")[1]) for key in state if key.startswith("features."))
    units = {}  # block -> number of conv-norm-act units (the linear projection follows them)
    for key in state:
        parts = key.split(".")
        if len(parts) == 6 and parts[2] == "conv":
            units[parts[1]] = max(units.get(parts[1], 0), int(parts[3]) + 1)
    renamed = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "features" and int(parts[1]) == last:
            key = ".".join(["conv"] + parts[2:])
        elif parts[0] == "features" and len(parts) == 6 and parts[2] == "conv":
            key = ".".join(parts[:3] + [str(3 * int(parts[3]) + int(parts[4])), parts[5]])
        elif parts[0] == "features" and len(parts) == 5 and parts[2] == "conv":
            count = units[parts[1]]
            key = ".".join(parts[:3] + [str(3 * count + int(parts[3]) - count), parts[4]])
        renamed[key] = value
    return renamed


# timm's mobilenetv2_* stages hold 1, 2, 3, 4, 3, 3, 1 blocks (its EfficientNets and MnasNets differ).
_TIMM_STAGE_DEPTHS = (1, 2, 3, 4, 3, 3, 1)


def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return "conv_stem.weight" in state


def _is_torchvision(state: Mapping[str, Tensor]) -> bool:
    return "features.1.conv.0.0.weight" in state


def rename_mobilenetv2_weights(state: StateDict) -> StateDict:
    """An ImageNet MobileNetV2 file's keys -> ours: torchvision's and timm's renamed, fast-reid's /
    tonylins' kept (they are ours)."""
    if _is_timm(state):
        return rename_timm_mobilenet(state, _our_unit_name)
    if _is_torchvision(state):
        return _rename_torchvision(state)
    return state


def is_mobilenetv2_file(state: Mapping[str, Tensor]) -> bool:
    """True for a MobileNetV2 file of fast-reid / tonylins, torchvision or timm."""
    if _is_timm(state):
        return timm_stage_depths(state) == _TIMM_STAGE_DEPTHS
    if _is_torchvision(state):
        return "features.18.0.weight" in state
    flat = state.get("features.1.conv.0.weight")
    return flat is not None and flat.dim() == 4 and "conv.0.weight" in state


register_weights_family(WeightsFamily(
    name="MobileNetV2", fingerprint=is_mobilenetv2_file, rename=rename_mobilenetv2_weights,
    dropped_prefixes=("classifier.",), releases="torchvision, timm or tonylins"))


# ----------------------------------------------------------------------------- builder
def check_mobilenetv2_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (a MobileNetV2 width), NORM, LAST_STRIDE and that no
    WITH_IBN / WITH_SE / WITH_NL is asked for, building nothing."""
    lookup(MOBILENETV2_DEPTHS, cfg.MODEL.BACKBONE.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, supported=())
    check_choice(cfg.MODEL.BACKBONE.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")


@BACKBONE_REGISTRY.register()
def build_mobilenetv2_backbone(cfg) -> MobileNetV2:
    """Build a MobileNetV2 from MODEL.BACKBONE.{DEPTH, NORM, PRETRAIN, PRETRAIN_PATH}
    (LAST_STRIDE is checked but, as in fast-reid, changes nothing: the output stride is 32).

    Args:
        cfg: the config tree.

    Returns:
        MobileNetV2 with `out_channels` 1280 at every DEPTH.
    """
    opts = cfg.MODEL.BACKBONE
    check_mobilenetv2_config(cfg)
    model = MobileNetV2(MOBILENETV2_DEPTHS[opts.DEPTH], norm=opts.NORM)
    if opts.PRETRAIN:
        load_imagenet_weights(model, opts.PRETRAIN_PATH, "MobileNetV2")
    return model


build_mobilenetv2_backbone.check_config = check_mobilenetv2_config
