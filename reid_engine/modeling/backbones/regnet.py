"""RegNetX / RegNetY (pycls's design space, 200MF-6.4GF) as fast-reid builds them.

A RegNet is four stages of residual bottleneck blocks (1x1, grouped 3x3, 1x1) whose widths
follow a quantised linear rule (Radosavovic et al., "Designing Network Design Spaces",
2020). RegNetY adds squeeze-excitation to every block. Module names are pycls's (stem.conv,
s1.b1.proj / bn / f.a / f.a_bn / f.b / f.se.f_ex.0 / f.c ...), so fast-reid checkpoints and
pycls ImageNet files load unchanged; torchvision's and timm's releases are renamed.
"""
import itertools
import math
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import nn

from reid_engine.utils.registry import check_choice, lookup

from ..layers import NORM_NAMES
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import WeightsFamily, WeightsFamilyError, load_imagenet_weights, register_weights_family, rename_keys
from .pycls_blocks import SqueezeExcitation, Stem, conv_norm, init_pycls_weights, stage

__all__ = ["RegNetSpec", "REGNET_DEPTHS", "regnet_stages", "ResBottleneckBlock", "RegNet",
           "build_regnet_backbone"]


class RegNetSpec(NamedTuple):
    """The parameters of one RegNet (pycls's REGNET.* config keys).

    Attributes:
        blocks: total number of blocks (REGNET.DEPTH).
        w0: width of the first block (W0).
        wa: slope of the linear width rule (WA).
        wm: width multiplier between stages, the quantisation base (WM).
        group_w: channels per group of the 3x3 convolutions (GROUP_W).
        with_se: squeeze-excitation in every block (SE_ON; the Y models).
        bottleneck_mult: bottleneck width / block width (BOT_MUL).
    """

    blocks: int
    w0: int
    wa: float
    wm: float
    group_w: int
    with_se: bool
    bottleneck_mult: float = 1.0


# pycls's RegNet{X,Y}-<flops>_dds_8gpu.yaml files as fast-reid 1.4 ships them, by fast-reid's
# DEPTH string (its stem width 32, stride 2 and SE ratio 0.25 are pycls's defaults).
REGNET_DEPTHS: Dict[str, RegNetSpec] = {
    "200x": RegNetSpec(13, 24, 36.44, 2.49, 8, False),
    "200y": RegNetSpec(13, 24, 36.44, 2.49, 8, True),
    "400x": RegNetSpec(22, 24, 24.48, 2.54, 16, False),
    "400y": RegNetSpec(16, 48, 27.89, 2.09, 8, True),
    "800x": RegNetSpec(16, 56, 35.73, 2.28, 16, False),
    "800y": RegNetSpec(14, 56, 38.84, 2.4, 16, True),
    "1600x": RegNetSpec(18, 80, 34.01, 2.25, 24, False),
    "1600y": RegNetSpec(27, 48, 20.71, 2.65, 24, True),
    "3200x": RegNetSpec(25, 88, 26.31, 2.25, 48, False),
    "3200y": RegNetSpec(21, 80, 42.63, 2.66, 24, True),
    "4000x": RegNetSpec(23, 96, 38.65, 2.43, 40, False),
    "4000y": RegNetSpec(22, 96, 31.41, 2.24, 64, True),
    "6400x": RegNetSpec(17, 184, 60.83, 2.07, 56, False),
    "6400y": RegNetSpec(25, 112, 33.22, 2.27, 72, True),
}

_STEM_WIDTH = 32
_SE_RATIO = 0.25
_WIDTH_QUANTUM = 8


def _block_widths(spec: RegNetSpec) -> List[int]:
    """Per-block widths: the linear widths w0 + wa * i snapped to w0 * wm^k (k rounded to
    an integer), then rounded to a multiple of 8."""
    widths = []
    for index in range(spec.blocks):
        linear = spec.w0 + spec.wa * index
        exponent = round(math.log(linear / spec.w0) / math.log(spec.wm))
        widths.append(int(round(spec.w0 * spec.wm ** exponent / _WIDTH_QUANTUM) * _WIDTH_QUANTUM))
    return widths


def regnet_stages(spec: RegNetSpec) -> List[Tuple[int, int, int]]:
    """The stages of a RegNet: runs of equal block widths, the widths then made divisible
    by the group width (of the bottleneck), and the group width capped at the bottleneck.

    Args:
        spec: the RegNet parameters.

    Returns:
        [(width, blocks, group width)] per stage.
    """
    stages = []
    for width, run in itertools.groupby(_block_widths(spec)):
        bottleneck = int(width * spec.bottleneck_mult)
        group_w = min(spec.group_w, bottleneck)
        bottleneck = int(round(bottleneck / group_w) * group_w)
        stages.append((int(bottleneck / spec.bottleneck_mult), len(list(run)), group_w))
    return stages


class _BottleneckTransform(nn.Module):
    """1x1 - grouped 3x3 (with the stride) - [SE] - 1x1, norms after each conv (pycls's `f`)."""

    def __init__(self, w_in: int, w_out: int, stride: int, norm: str, bottleneck_mult: float,
                 group_w: int, se_ratio: float):
        super().__init__()
        w_b = int(round(w_out * bottleneck_mult))
        self.a, self.a_bn = conv_norm(w_in, w_b, 1, norm)
        self.b, self.b_bn = conv_norm(w_b, w_b, 3, norm, stride=stride, groups=w_b // group_w)
        # pycls squeezes relative to the block's input width, not the bottleneck's.
        self.se = SqueezeExcitation(w_b, int(round(w_in * se_ratio)), nn.ReLU(inplace=True)) if se_ratio else None
        self.c, self.c_bn = conv_norm(w_b, w_out, 1, norm)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The residual branch."""
        x = self.relu(self.a_bn(self.a(x)))
        x = self.relu(self.b_bn(self.b(x)))
        if self.se is not None:
            x = self.se(x)
        return self.c_bn(self.c(x))


class ResBottleneckBlock(nn.Module):
    """relu(shortcut(x) + f(x)); the shortcut is a strided 1x1 conv + norm (`proj`, `bn`)
    where the shape changes, else the identity.

    Args:
        w_in, w_out: input / output channels.
        stride: stride of the 3x3 convolution (and the projection).
        norm: norm name (see get_norm).
        bottleneck_mult: bottleneck width / w_out.
        group_w: channels per group of the 3x3 convolution.
        se_ratio: squeeze width / w_in, or 0 for no squeeze-excitation.
    """

    def __init__(self, w_in: int, w_out: int, stride: int, norm: str, bottleneck_mult: float = 1.0,
                 group_w: int = 1, se_ratio: float = 0.0):
        super().__init__()
        self.has_proj = w_in != w_out or stride != 1
        if self.has_proj:
            self.proj, self.bn = conv_norm(w_in, w_out, 1, norm, stride=stride)
        self.f = _BottleneckTransform(w_in, w_out, stride, norm, bottleneck_mult, group_w, se_ratio)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return relu(shortcut(x) + f(x))."""
        shortcut = self.bn(self.proj(x)) if self.has_proj else x
        return self.relu(shortcut + self.f(x))


class RegNet(nn.Module):
    """A RegNet trunk returning the last stage's feature map.

    Args:
        spec: the RegNet parameters.
        last_stride: stride of the last stage (1 keeps a 2x larger map, the ReID default).
        norm: norm name for every norm layer.
        with_se: squeeze-excitation in every block; None takes the spec's (on for RegNetY).
    """

    def __init__(self, spec: RegNetSpec, *, last_stride: int = 1, norm: str = "BN",
                 with_se: Optional[bool] = None):
        super().__init__()
        se_ratio = _SE_RATIO if (spec.with_se if with_se is None else with_se) else 0.0
        self.stem = Stem(_STEM_WIDTH, norm, nn.ReLU(inplace=True))
        stages = regnet_stages(spec)
        w_in = _STEM_WIDTH
        for index, (width, blocks, group_w) in enumerate(stages, start=1):
            stride = last_stride if index == len(stages) else 2
            setattr(self, f"s{index}", stage(
                ResBottleneckBlock(w_in if b == 0 else width, width, stride if b == 0 else 1, norm,
                                   spec.bottleneck_mult, group_w, se_ratio)
                for b in range(blocks)))
            w_in = width
        self.num_stages = len(stages)
        self.out_channels = w_in
        init_pycls_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images (B, 3, H, W) to the last stage's map (B, out_channels, h, w)."""
        x = self.stem(x)
        for index in range(1, self.num_stages + 1):
            x = getattr(self, f"s{index}")(x)
        return x


def check_regnet_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (a RegNet depth), NORM, LAST_STRIDE and the options
    (only WITH_SE), building nothing."""
    lookup(REGNET_DEPTHS, cfg.MODEL.BACKBONE.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, ("WITH_SE",))
    check_choice(cfg.MODEL.BACKBONE.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")


@BACKBONE_REGISTRY.register()
def build_regnet_backbone(cfg) -> RegNet:
    """Build a RegNet from MODEL.BACKBONE.{DEPTH, LAST_STRIDE, NORM, WITH_SE, PRETRAIN,
    PRETRAIN_PATH}.

    DEPTH is fast-reid's: "200x", "200y", ..., "6400y" (MFLOPs; x = RegNetX, y = RegNetY).
    LAST_STRIDE is the stride of the fourth stage. WITH_SE True adds RegNetY's
    squeeze-excitation to a RegNetX (the layout of fast-reid checkpoints of a RegNetX built
    after a RegNetY in one process); a RegNetY always has it.

    Args:
        cfg: the config tree.

    Returns:
        RegNet with `out_channels` the fourth stage's width (e.g. 912 for 1600x).
    """
    opts = cfg.MODEL.BACKBONE
    check_regnet_config(cfg)
    spec = REGNET_DEPTHS[opts.DEPTH]
    model = RegNet(spec, last_stride=opts.LAST_STRIDE, norm=opts.NORM, with_se=spec.with_se or opts.WITH_SE)
    if opts.PRETRAIN:
        _load_regnet_weights(model, opts.PRETRAIN_PATH, opts.DEPTH)
    return model


build_regnet_backbone.check_config = check_regnet_config


# ------------------------------------------------------------------------ ImageNet weights

_TORCHVISION_RULES = (
    (r"^stem\.0\.", "stem.conv."),
    (r"^stem\.1\.", "stem.bn."),
    (r"^trunk_output\.block(\d+)\.block\d+-(\d+)\.", lambda m: f"s{m[1]}.b{int(m[2]) + 1}."),
    (r"\.proj\.0\.", ".proj."),
    (r"\.proj\.1\.", ".bn."),
    (r"\.f\.([abc])\.0\.", r".f.\1."),
    (r"\.f\.([abc])\.1\.", r".f.\1_bn."),
    (r"\.f\.se\.fc1\.", ".f.se.f_ex.0."),
    (r"\.f\.se\.fc2\.", ".f.se.f_ex.2."),
)
_TIMM_RULES = (
    (r"^(s\d+\.b\d+)\.conv([123])\.(conv|bn)\.",
     lambda m: f"{m[1]}.f.{'abc'[int(m[2]) - 1]}{'' if m[3] == 'conv' else '_bn'}."),
    (r"^(s\d+\.b\d+)\.se\.fc1\.", r"\1.f.se.f_ex.0."),
    (r"^(s\d+\.b\d+)\.se\.fc2\.", r"\1.f.se.f_ex.2."),
    (r"^(s\d+\.b\d+)\.downsample\.conv\.", r"\1.proj."),
    (r"^(s\d+\.b\d+)\.downsample\.bn\.", r"\1.bn."),
)


def _rename_regnet_weights(state):
    """torchvision's (stem.0, trunk_output.block1.block1-0.f.a.0, ...) and timm's
    (s1.b1.conv1.conv, s1.b1.se.fc1, s1.b1.downsample.conv, ...) keys to pycls's; pycls's
    own files already match."""
    return rename_keys(state, _TORCHVISION_RULES + _TIMM_RULES)


def _load_regnet_weights(model: RegNet, path: str, depth: str) -> None:
    """load_imagenet_weights, refusing a file whose stage widths differ from the model's.

    torchvision rounds RegNet widths to the group width half-up where pycls (fast-reid,
    timm) rounds half-to-even, so its regnet_x_400mf and regnet_y_800mf have other stage
    widths (e.g. 144 / 784 in place of 128 / 768): loading only the tensors that fit would
    leave a half-initialised network.
    """
    incompatible = load_imagenet_weights(model, path, "RegNet")
    if incompatible.incorrect_shapes:
        key, file_shape, model_shape = incompatible.incorrect_shapes[0]
        raise WeightsFamilyError(
            f"MODEL.BACKBONE.PRETRAIN_PATH: {path} has {len(incompatible.incorrect_shapes)} tensors of other "
            f"shapes than RegNet {depth} (first: {key} {tuple(file_shape)} vs {tuple(model_shape)}); it is "
            "another RegNet (torchvision's regnet_x_400mf / regnet_y_800mf round widths unlike pycls): use "
            "pycls's or timm's ImageNet file of this MODEL.BACKBONE.DEPTH")


def _is_regnet_weights(state) -> bool:
    # pycls / fast-reid name the bottleneck f.a; EfficientNet's pycls files share stem.conv
    # and s1.b1 but have f.a nowhere.
    return ("s1.b1.f.a.weight" in state
            or "trunk_output.block1.block1-0.f.a.0.weight" in state
            or ("s1.b1.conv1.conv.weight" in state and "s1.b1.conv3.conv.weight" in state))


register_weights_family(WeightsFamily(
    name="RegNet", fingerprint=_is_regnet_weights, rename=_rename_regnet_weights,
    dropped_prefixes=("fc.", "head."), releases="pycls, torchvision or timm"))
