"""EfficientNet-B0..B7 (pycls's implementation) as fast-reid builds it.

Seven stages of mobile inverted bottlenecks (MBConv: 1x1 expansion, depthwise kxk,
squeeze-excitation, linear 1x1 projection; Swish activations) between a 3x3 stem and a
1x1 head convolution (Tan & Le, "EfficientNet", 2019). Module names are pycls's (stem.conv,
s1.b1.dwise / dwise_bn / se.f_ex.0 / lin_proj / lin_proj_bn, s2.b1.exp ..., head.conv /
head.conv_bn), so fast-reid checkpoints and pycls ImageNet files load unchanged;
torchvision's and timm's releases are renamed. The head keeps its 1x1 convolution (the
output has HEAD_W channels) and drops pycls's pooling / classifier.
"""
import re
from typing import Dict, NamedTuple, Optional, Tuple

import torch
from torch import nn

from reid_engine.utils.registry import check_choice, lookup

from ..layers import NORM_NAMES
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import WeightsFamily, load_imagenet_weights, register_weights_family, rename_keys
from .pycls_blocks import SqueezeExcitation, Stem, conv_norm, init_pycls_weights, stage

__all__ = ["EffNetSpec", "EFFNET_DEPTHS", "MBConv", "EffNet", "build_effnet_backbone"]


class EffNetSpec(NamedTuple):
    """The per-model parameters of an EfficientNet (pycls's EN.* config keys).

    Attributes:
        stem_w: stem width (EN.STEM_W).
        depths: blocks per stage (EN.DEPTHS).
        widths: output width per stage (EN.WIDTHS).
        head_w: width of the head's 1x1 convolution, the output channels (EN.HEAD_W).
    """

    stem_w: int
    depths: Tuple[int, ...]
    widths: Tuple[int, ...]
    head_w: int


# pycls's EN-B<i>_dds_8gpu.yaml files as fast-reid 1.4 ships them (b0-b5). b6 / b7 have no
# yaml there (fast-reid's builder fails on them); their rows follow the same compound
# scaling (width x1.8 / x2.0, depth x2.6 / x3.1 of b0, widths rounded to multiples of 8 as
# for b1-b5), the models of torchvision's and timm's releases.
EFFNET_DEPTHS: Dict[str, EffNetSpec] = {
    "b0": EffNetSpec(32, (1, 2, 2, 3, 3, 4, 1), (16, 24, 40, 80, 112, 192, 320), 1280),
    "b1": EffNetSpec(32, (2, 3, 3, 4, 4, 5, 2), (16, 24, 40, 80, 112, 192, 320), 1280),
    "b2": EffNetSpec(32, (2, 3, 3, 4, 4, 5, 2), (16, 24, 48, 88, 120, 208, 352), 1408),
    "b3": EffNetSpec(40, (2, 3, 3, 5, 5, 6, 2), (24, 32, 48, 96, 136, 232, 384), 1536),
    "b4": EffNetSpec(48, (2, 4, 4, 6, 6, 8, 2), (24, 32, 56, 112, 160, 272, 448), 1792),
    "b5": EffNetSpec(48, (3, 5, 5, 7, 7, 9, 3), (24, 40, 64, 128, 176, 304, 512), 2048),
    "b6": EffNetSpec(56, (3, 6, 6, 8, 8, 11, 3), (32, 40, 72, 144, 200, 344, 576), 2304),
    "b7": EffNetSpec(64, (4, 7, 7, 10, 10, 13, 4), (32, 48, 80, 160, 224, 384, 640), 2560),
}

# Shared by every EfficientNet (the same in all of pycls's EN-B* files).
STAGE_STRIDES = (1, 2, 2, 2, 1, 2, 1)
STAGE_EXPANSIONS = (1, 6, 6, 6, 6, 6, 6)
STAGE_KERNELS = (3, 3, 5, 3, 5, 5, 3)
SE_RATIO = 0.25
# The stage whose stride MODEL.BACKBONE.LAST_STRIDE sets (s6, the last that downsamples).
_LAST_STRIDE_STAGE = 5


def _drop_connect(x: torch.Tensor, rate: float) -> torch.Tensor:
    """Zero whole samples of a residual branch with probability `rate`, scaling the rest by
    1 / (1 - rate) (pycls's drop connect, i.e. stochastic depth)."""
    keep = 1.0 - rate
    mask = torch.empty(x.shape[0], 1, 1, 1, dtype=x.dtype, device=x.device).bernoulli_(keep)
    return x / keep * mask


class MBConv(nn.Module):
    """Mobile inverted bottleneck with squeeze-excitation and Swish.

    [1x1 expansion `exp`] - depthwise kxk `dwise` - SE - linear 1x1 `lin_proj`, each conv
    followed by its norm (`<name>_bn`); a residual connection where shapes allow.

    Args:
        w_in, w_out: input / output channels.
        expansion: expanded width / w_in (no expansion conv at 1).
        kernel: depthwise kernel size.
        stride: depthwise stride.
        norm: norm name (see get_norm).
        drop_connect: rate of dropping the residual branch in training (0 = never).
    """

    def __init__(self, w_in: int, w_out: int, expansion: float, kernel: int, stride: int, norm: str,
                 drop_connect: float = 0.0):
        super().__init__()
        w_exp = int(w_in * expansion)
        self.exp: Optional[nn.Module] = None
        if w_exp != w_in:
            self.exp, self.exp_bn = conv_norm(w_in, w_exp, 1, norm)
        self.dwise, self.dwise_bn = conv_norm(w_exp, w_exp, kernel, norm, stride=stride, groups=w_exp)
        # pycls squeezes relative to the block's input width, not the expanded one.
        self.se = SqueezeExcitation(w_exp, int(w_in * SE_RATIO), nn.SiLU())
        self.lin_proj, self.lin_proj_bn = conv_norm(w_exp, w_out, 1, norm)
        self.swish = nn.SiLU()
        self.has_skip = stride == 1 and w_in == w_out
        self.drop_connect = drop_connect

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output (B, w_out, h / stride, w / stride)."""
        out = x
        if self.exp is not None:
            out = self.swish(self.exp_bn(self.exp(out)))
        out = self.swish(self.dwise_bn(self.dwise(out)))
        out = self.lin_proj_bn(self.lin_proj(self.se(out)))
        if not self.has_skip:
            return out
        if self.training and self.drop_connect > 0.0:
            out = _drop_connect(out, self.drop_connect)
        return x + out


class _Head(nn.Module):
    """1x1 convolution to the head width, norm, Swish (pycls's head without pool / fc)."""

    def __init__(self, w_in: int, w_out: int, norm: str):
        super().__init__()
        self.conv, self.conv_bn = conv_norm(w_in, w_out, 1, norm)
        self.swish = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return swish(norm(conv(x)))."""
        return self.swish(self.conv_bn(self.conv(x)))


class EffNet(nn.Module):
    """An EfficientNet trunk and head convolution returning (B, head width, h, w).

    Args:
        spec: the per-model parameters.
        last_stride: stride of stage s6 (1 keeps a 2x larger map, the ReID default).
        norm: norm name for every norm layer.
        drop_connect: residual drop rate in training; fast-reid's EN files leave pycls's
            EN.DC_RATIO at its default 0.0, so its models never drop.
    """

    def __init__(self, spec: EffNetSpec, *, last_stride: int = 1, norm: str = "BN", drop_connect: float = 0.0):
        super().__init__()
        self.stem = Stem(spec.stem_w, norm, nn.SiLU())
        w_in = spec.stem_w
        stage_params = zip(spec.depths, spec.widths, STAGE_EXPANSIONS, STAGE_KERNELS, STAGE_STRIDES)
        for index, (blocks, width, expansion, kernel, stride) in enumerate(stage_params):
            if index == _LAST_STRIDE_STAGE:
                stride = last_stride
            setattr(self, f"s{index + 1}", stage(
                MBConv(w_in if b == 0 else width, width, expansion, kernel, stride if b == 0 else 1, norm,
                       drop_connect)
                for b in range(blocks)))
            w_in = width
        self.num_stages = len(spec.depths)
        self.head = _Head(w_in, spec.head_w, norm)
        self.out_channels = spec.head_w
        init_pycls_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images (B, 3, H, W) to the head's map (B, out_channels, h, w)."""
        x = self.stem(x)
        for index in range(1, self.num_stages + 1):
            x = getattr(self, f"s{index}")(x)
        return self.head(x)


def check_effnet_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (b0-b7), NORM, LAST_STRIDE and that no WITH_* option is
    set, building nothing."""
    lookup(EFFNET_DEPTHS, cfg.MODEL.BACKBONE.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, ())
    check_choice(cfg.MODEL.BACKBONE.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")


@BACKBONE_REGISTRY.register()
def build_effnet_backbone(cfg) -> EffNet:
    """Build an EfficientNet from MODEL.BACKBONE.{DEPTH, LAST_STRIDE, NORM, PRETRAIN,
    PRETRAIN_PATH}.

    DEPTH is "b0".."b7"; LAST_STRIDE is the stride of stage s6. The squeeze-excitation is
    part of every EfficientNet (WITH_SE / WITH_IBN / WITH_NL are refused).

    Args:
        cfg: the config tree.

    Returns:
        EffNet with `out_channels` the head width (1280 for b0, ..., 2560 for b7).
    """
    opts = cfg.MODEL.BACKBONE
    check_effnet_config(cfg)
    model = EffNet(EFFNET_DEPTHS[opts.DEPTH], last_stride=opts.LAST_STRIDE, norm=opts.NORM)
    if opts.PRETRAIN:
        load_imagenet_weights(model, opts.PRETRAIN_PATH, "EfficientNet")
    return model


build_effnet_backbone.check_config = check_effnet_config


# ------------------------------------------------------------------------ ImageNet weights

_TORCHVISION_TOP_RULES = (
    (r"^features\.0\.0\.", "stem.conv."),
    (r"^features\.0\.1\.", "stem.bn."),
    (r"^features\.8\.0\.", "head.conv."),
    (r"^features\.8\.1\.", "head.conv_bn."),
)
_TIMM_TOP_RULES = (
    (r"^conv_stem\.", "stem.conv."),
    (r"^bn1\.", "stem.bn."),
    (r"^conv_head\.", "head.conv."),
    (r"^bn2\.", "head.conv_bn."),
)
_SE_NAMES = {"fc1": "f_ex.0", "fc2": "f_ex.2", "conv_reduce": "f_ex.0", "conv_expand": "f_ex.2"}

# torchvision's MBConv is a Sequential of ([expansion,] depthwise, SE, projection), each
# conv + norm pair a Sequential (0 conv, 1 norm): the meaning of an index depends on whether
# the block expands (then it has four parts).
_TORCHVISION_BLOCK = re.compile(r"^features\.(\d+)\.(\d+)\.block\.(\d)\.(\w+)\.(.*)$")
_TORCHVISION_PARTS = {True: ("exp", "dwise", "se", "lin_proj"), False: ("dwise", "se", "lin_proj")}
# timm's blocks: a depthwise-separable one without expansion (stage 1) and the inverted
# residual, whose conv_pw is the expansion (the projection is conv_pwl).
_TIMM_BLOCK = re.compile(r"^blocks\.(\d+)\.(\d+)\.(\w+)\.(.*)$")
_TIMM_PARTS = {
    True: {"conv_pw": "exp", "bn1": "exp_bn", "conv_dw": "dwise", "bn2": "dwise_bn",
           "conv_pwl": "lin_proj", "bn3": "lin_proj_bn"},
    False: {"conv_dw": "dwise", "bn1": "dwise_bn", "conv_pw": "lin_proj", "bn2": "lin_proj_bn"},
}


def _torchvision_block_key(state, match) -> str:
    stage_index, block, part, layer, rest = match.groups()
    expands = f"features.{stage_index}.{block}.block.3.0.weight" in state
    name = _TORCHVISION_PARTS[expands][int(part)]
    if name == "se":
        local = f"se.{_SE_NAMES[layer]}"
    else:
        local = name if layer == "0" else f"{name}_bn"
    return f"s{stage_index}.b{int(block) + 1}.{local}.{rest}"


def _timm_block_key(state, match) -> str:
    stage_index, block, layer, rest = match.groups()
    if layer == "se":
        layer, rest = rest.split(".", 1)
        local = f"se.{_SE_NAMES[layer]}"
    else:
        expands = f"blocks.{stage_index}.{block}.conv_pwl.weight" in state
        local = _TIMM_PARTS[expands][layer]
    return f"s{int(stage_index) + 1}.b{int(block) + 1}.{local}.{rest}"


def _rename_effnet_weights(state):
    """torchvision's (features.i.j.block.k...) and timm's (conv_stem, blocks.i.j.conv_dw, ...)
    keys to pycls's; pycls's own files already match."""
    renamed = {}
    for key, value in state.items():
        tv_match, timm_match = _TORCHVISION_BLOCK.match(key), _TIMM_BLOCK.match(key)
        if tv_match:
            key = _torchvision_block_key(state, tv_match)
        elif timm_match:
            key = _timm_block_key(state, timm_match)
        renamed[key] = value
    return rename_keys(renamed, _TORCHVISION_TOP_RULES + _TIMM_TOP_RULES)


def _is_effnet_weights(state) -> bool:
    # pycls's depthwise conv `dwise` tells it from RegNet (which shares stem.conv and s1.b1);
    # torchvision's stage-1 SE (fc1) from its MobileNets (features.1.block...) and
    # EfficientNetV2 (fused stage 1); timm's head norm bn2 from its MobileNetV3.
    return (("stem.conv.weight" in state and "s1.b1.dwise.weight" in state)
            or ("features.0.0.weight" in state and "features.1.0.block.1.fc1.weight" in state)
            or all(key in state for key in ("conv_stem.weight", "blocks.0.0.conv_dw.weight",
                                            "blocks.0.0.se.conv_reduce.weight", "conv_head.weight",
                                            "bn2.weight")))


register_weights_family(WeightsFamily(
    name="EfficientNet", fingerprint=_is_effnet_weights, rename=_rename_effnet_weights,
    dropped_prefixes=("classifier.", "head.fc."), releases="pycls, torchvision or timm"))
