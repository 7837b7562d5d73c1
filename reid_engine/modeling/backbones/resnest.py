"""ResNeSt family (50x / 101x / 200x / 269x) for ReID, as fast-reid builds it.

A ResNet-D trunk (deep stem of three 3x3 convs, average-pooled shortcuts) whose bottlenecks
use a split-attention 3x3 conv with radix 2 (cardinality 1, bottleneck width 64). Module
names are those of the authors' release (zhanghang1989/ResNeSt), fast-reid's and timm's:
conv1.0/1/3/4/6 and bn1 (stem), layerN.B.conv1/bn1, conv2.conv/bn0/fc1/bn1/fc2 (split
attention), conv3/bn3, downsample.1/2 (downsample.0 is the weight-free average pool).

fast-reid's last stride 1 keeps layer4 at stride 1 and dilates all but its first block by 2;
its first block still smooths with a 3x3, stride-1 average pool (the "avd" pool).
"""
import logging
from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from reid_engine.utils.registry import check_choice, lookup

from ..layers import NORM_NAMES, get_norm, init_fan_out
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import WeightsFamily, load_imagenet_weights, register_weights_family
from .resnet import _ResidualBlock

logger = logging.getLogger(__name__)

__all__ = ["SplitAttentionConv", "ResNeStBottleneck", "ResNeSt", "RESNEST_DEPTHS", "build_resnest_backbone"]


class SplitAttentionConv(nn.Module):
    """ResNeSt's split-attention 3x3 conv (cardinality 1).

    A 3x3 conv with `radix` groups gives `radix` candidate maps of `channels` channels each;
    their sum is pooled globally and passed through fc1-norm-relu-fc2, and a softmax over
    the candidates (per channel) weighs them into one map.

    Args:
        channels: input and output channels.
        norm: norm name (see get_norm) of bn0 and bn1.
        radix: number of candidate maps (splits), at least 2.
        stride, dilation: of the 3x3 conv (padding = dilation keeps the size at stride 1).
        reduction: fc1 has radix * channels / reduction outputs, at least `min_attention_channels`.
        min_attention_channels: the floor of fc1's width.
    """

    def __init__(self, channels: int, norm: str, *, radix: int = 2, stride: int = 1, dilation: int = 1,
                 reduction: int = 4, min_attention_channels: int = 32):
        super().__init__()
        if radix < 2:
            raise ValueError(f"split attention needs radix >= 2, got {radix}")
        attention_channels = max(channels * radix // reduction, min_attention_channels)
        self.radix = radix
        self.conv = nn.Conv2d(channels, channels * radix, 3, stride=stride, padding=dilation,
                              dilation=dilation, groups=radix, bias=False)
        self.bn0 = get_norm(norm, channels * radix)
        self.relu = nn.ReLU(inplace=True)
        self.fc1 = nn.Conv2d(channels, attention_channels, 1)
        self.bn1 = get_norm(norm, attention_channels)
        self.fc2 = nn.Conv2d(attention_channels, channels * radix, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, channels, H, W) to (B, channels, H', W')."""
        x = self.relu(self.bn0(self.conv(x)))
        batch, _, height, width = x.shape
        # the conv's output groups are the candidates: split r is channels [r*C, (r+1)*C)
        splits = x.view(batch, self.radix, -1, height, width)
        context = splits.sum(1).mean((2, 3), keepdim=True)
        logits = self.fc2(self.relu(self.bn1(self.fc1(context))))
        weights = logits.view(batch, self.radix, -1, 1, 1).softmax(dim=1)
        return (weights * splits).sum(1)


class ResNeStBottleneck(_ResidualBlock):
    """1x1 reduce, split-attention 3x3, 1x1 expand by 4.

    Args:
        inplanes: input channels.
        planes: inner channels; the output has planes * 4.
        norm: norm name (see get_norm).
        stride: the block's stride.
        dilation: dilation of the 3x3.
        avd: take the stride with a 3x3 average pool after the split attention (ResNeSt's
            "avd", as fast-reid places it: after, not before) instead of in the conv.
        radix: splits of the split attention.
        downsample: shortcut projection or None.
    """

    expansion = 4

    def __init__(self, inplanes: int, planes: int, norm: str, *, stride: int = 1, dilation: int = 1,
                 avd: bool = False, radix: int = 2, downsample: Optional[nn.Module] = None):
        super().__init__(planes * self.expansion, False, downsample)
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = get_norm(norm, planes)
        self.conv2 = SplitAttentionConv(planes, norm, radix=radix, stride=1 if avd else stride,
                                        dilation=dilation)
        self.avd_layer = nn.AvgPool2d(3, stride, padding=1) if avd else nn.Identity()
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = get_norm(norm, planes * self.expansion)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """conv1x1-norm-relu, split attention, (avd pool), conv1x1-norm."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.avd_layer(self.conv2(out))
        return self.bn3(self.conv3(out))


def _avg_down_shortcut(inplanes: int, outplanes: int, stride: int, norm: str) -> nn.Sequential:
    """ResNet-D shortcut: average pool (stride x stride windows), then 1x1 conv and norm.

    Index 0 holds no weights, so the keys are downsample.1 (conv) and downsample.2 (norm).
    """
    # ceil_mode / count_include_pad as ResNeSt: odd map sizes keep their last row/column,
    # averaged over the pixels that exist.
    pool = (nn.AvgPool2d(stride, stride, ceil_mode=True, count_include_pad=False) if stride > 1
            else nn.Identity())
    return nn.Sequential(pool, nn.Conv2d(inplanes, outplanes, 1, bias=False), get_norm(norm, outplanes))


class ResNeSt(nn.Module):
    """ResNeSt trunk returning the layer4 feature map.

    Args:
        blocks_per_stage: number of blocks in layer1..layer4.
        stem_width: channels of the first two stem convs; the stem gives twice as many.
        last_stride: 2, or 1 for a layer4 at stride 1 with dilation 2 after its first
            block (fast-reid's rule).
        norm: norm name for every norm layer.
        radix: splits of every split-attention conv.
    """

    def __init__(self, blocks_per_stage: Sequence[int], *, stem_width: int = 32, last_stride: int = 1,
                 norm: str = "BN", radix: int = 2):
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv2d(3, stem_width, 3, stride=2, padding=1, bias=False),
            get_norm(norm, stem_width),
            nn.ReLU(inplace=True),
            nn.Conv2d(stem_width, stem_width, 3, padding=1, bias=False),
            get_norm(norm, stem_width),
            nn.ReLU(inplace=True),
            nn.Conv2d(stem_width, stem_width * 2, 3, padding=1, bias=False),
        )
        self.bn1 = get_norm(norm, stem_width * 2)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = stem_width * 2
        # (planes, stride, dilation of the blocks after the first, avd pool in the first block):
        # layer1 has no avd pool (stride 1, not a "first" stage in ResNeSt's terms).
        stages = ((64, 1, 1, False), (128, 2, 1, True), (256, 2, 1, True),
                  (512, last_stride, 2 if last_stride == 1 else 1, True))
        for index, (count, (planes, stride, dilation, avd)) in enumerate(zip(blocks_per_stage, stages), start=1):
            setattr(self, f"layer{index}", self._make_stage(inplanes, planes, count, stride, dilation, avd,
                                                            norm, radix))
            inplanes = planes * ResNeStBottleneck.expansion
        self.out_channels = inplanes
        init_fan_out(self)

    @staticmethod
    def _make_stage(inplanes, planes, count, stride, dilation, avd, norm, radix) -> nn.Sequential:
        """One stage: the first block takes the stride (undilated, avd pool) and the shortcut."""
        outplanes = planes * ResNeStBottleneck.expansion
        downsample = None
        if stride != 1 or inplanes != outplanes:
            downsample = _avg_down_shortcut(inplanes, outplanes, stride, norm)
        blocks = [ResNeStBottleneck(inplanes, planes, norm, stride=stride, avd=avd, radix=radix,
                                    downsample=downsample)]
        blocks += [ResNeStBottleneck(outplanes, planes, norm, dilation=dilation, radix=radix)
                   for _ in range(1, count)]
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images (B, 3, H, W) to the layer4 feature map (B, out_channels, h, w)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for index in range(1, 5):
            x = getattr(self, f"layer{index}")(x)
        return x


#: depth -> (blocks per stage, stem width), as fast-reid's builder
RESNEST_DEPTHS = {
    "50x": ((3, 4, 6, 3), 32),
    "101x": ((3, 4, 23, 3), 64),
    "200x": ((3, 24, 36, 3), 64),
    "269x": ((3, 30, 48, 8), 64),
}


def check_resnest_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (a ResNeSt depth), NORM and LAST_STRIDE, and refuse
    WITH_IBN / WITH_SE, building nothing. WITH_NL is accepted and ignored, as fast-reid does:
    its own AGW_S50 / sbs_S50 files inherit WITH_NL True from their base files."""
    lookup(RESNEST_DEPTHS, cfg.MODEL.BACKBONE.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, ("WITH_NL",))
    check_choice(cfg.MODEL.BACKBONE.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")


@BACKBONE_REGISTRY.register()
def build_resnest_backbone(cfg) -> ResNeSt:
    """Build a ResNeSt from MODEL.BACKBONE.{DEPTH, LAST_STRIDE, NORM, PRETRAIN, PRETRAIN_PATH}.

    Args:
        cfg: the config tree.

    Returns:
        ResNeSt with `out_channels` 2048.
    """
    opts = cfg.MODEL.BACKBONE
    check_resnest_config(cfg)
    if opts.WITH_NL:
        logger.warning("MODEL.BACKBONE.WITH_NL has no effect on build_resnest_backbone: ResNeSt has no "
                       "non-local blocks (fast-reid ignores it too)")
    blocks_per_stage, stem_width = RESNEST_DEPTHS[opts.DEPTH]
    model = ResNeSt(blocks_per_stage, stem_width=stem_width, last_stride=opts.LAST_STRIDE, norm=opts.NORM)
    if opts.PRETRAIN:
        load_imagenet_weights(model, opts.PRETRAIN_PATH, "ResNeSt")
    return model


build_resnest_backbone.check_config = check_resnest_config


def _is_resnest(state: Mapping[str, Tensor]) -> bool:
    # deep stem plus a split-attention conv2 in the first block
    return all(key in state for key in ("conv1.0.weight", "layer1.0.conv2.conv.weight",
                                        "layer1.0.conv2.fc1.weight", "layer1.0.conv2.fc2.weight"))


# The authors' release (resnest50-528c19ca.pth, ...) and timm's resnest*d / *e files use our
# module names already: nothing to rename.
register_weights_family(WeightsFamily(
    name="ResNeSt", fingerprint=_is_resnest, dropped_prefixes=("fc.",),
    releases="ResNeSt authors' (zhanghang1989) or timm resnest"))
