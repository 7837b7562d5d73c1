"""ShuffleNetV2 0.5x-2.0x (Ma et al., 2018) for ReID, as fast-reid builds it: Megvii's
ShuffleNet-Series form.

Module names give fast-reid's (= Megvii's) keys: `first_conv.{0,1}`, `features.N.branch_main.*`
(1x1, 3x3 depthwise, 1x1), `features.N.branch_proj.*` (3x3 depthwise, 1x1; first block of a
stage only) and `conv_last.{0,1}`, so Megvii's ImageNet files (under "state_dict", with
"module.") load unrenamed. torchvision's ShuffleNetV2 is another network for the same paper
(its first block of a stage splits the output evenly, where Megvii's keeps the input width on
the projection branch, and it shuffles channels after a block instead of splitting even / odd
channels before it): its weights cannot be mapped onto these layers, and such a file is refused.

The output stride is 32 whatever MODEL.BACKBONE.LAST_STRIDE says: fast-reid's ShuffleNetV2 has
no last-stride option (a 256x128 image gives an 8x4 map).
"""
from typing import Mapping, Sequence

import torch
from torch import Tensor, nn

from reid_engine.utils.registry import check_choice, lookup

from ..layers import NORM_NAMES
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import WeightsFamily, load_imagenet_weights, register_weights_family
from .mobile_blocks import conv_norm_act

__all__ = ["SHUFFLENETV2_DEPTHS", "ShuffleV2Block", "ShuffleNetV2", "build_shufflenetv2_backbone"]

#: DEPTH -> output channels of stages 2, 3, 4 and of the last conv
SHUFFLENETV2_DEPTHS = {
    "0.5x": (48, 96, 192, 1024),
    "1.0x": (116, 232, 464, 1024),
    "1.5x": (176, 352, 704, 1024),
    "2.0x": (244, 488, 976, 2048),
}
_BLOCKS_PER_STAGE = (4, 8, 4)
_STEM_CHANNELS = 24


class ShuffleV2Block(nn.Module):
    """ShuffleNetV2 unit, Megvii's form.

    Stride 1: the even channels pass unchanged, the odd ones go through `branch_main`; the
    outputs are concatenated (passed first). Stride 2: `branch_proj` (keeping the input width)
    and `branch_main` (giving the rest of the output width) both see the whole input.
    `branch_main` is 1x1-norm-ReLU, 3x3 depthwise-norm, 1x1-norm-ReLU; `branch_proj` is 3x3
    depthwise-norm, 1x1-norm-ReLU.

    Args:
        in_channels, out_channels: channels in and out (equal for stride 1).
        stride: 1 or 2.
        norm: norm name for get_norm.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str):
        super().__init__()
        if stride == 1 and (in_channels != out_channels or in_channels % 2):
            raise ValueError(f"a stride-1 ShuffleNetV2 block keeps an even width, got {in_channels} -> {out_channels}")
        self.stride = stride
        # the main branch's input width is also the width the other path carries to the output
        main_in = in_channels if stride == 2 else in_channels // 2
        mid = out_channels // 2
        self.branch_main = nn.Sequential(
            *conv_norm_act(main_in, mid, 1, norm=norm),
            *conv_norm_act(mid, mid, 3, stride, groups=mid, norm=norm, activation=None),
            *conv_norm_act(mid, out_channels - main_in, 1, norm=norm),
        )
        self.branch_proj = None
        if stride == 2:
            self.branch_proj = nn.Sequential(
                *conv_norm_act(in_channels, in_channels, 3, stride, groups=in_channels, norm=norm, activation=None),
                *conv_norm_act(in_channels, in_channels, 1, norm=norm),
            )

    def forward(self, x: Tensor) -> Tensor:
        """Map (B, in_channels, H, W) to (B, out_channels, H / stride, W / stride)."""
        if self.branch_proj is None:
            # Megvii's channel shuffle: the previous block's concatenation is split into its
            # even and odd channels.
            return torch.cat((x[:, 0::2], self.branch_main(x[:, 1::2])), 1)
        return torch.cat((self.branch_proj(x), self.branch_main(x)), 1)


class ShuffleNetV2(nn.Module):
    """ShuffleNetV2 trunk (no classifier) returning the last 1x1 conv's map at stride 32.

    Args:
        channels: output channels of stages 2, 3, 4 and of the last conv.
        norm: norm name for every norm layer.
    """

    def __init__(self, channels: Sequence[int], norm: str = "BN"):
        super().__init__()
        *stage_channels, last_channels = channels
        self.first_conv = conv_norm_act(3, _STEM_CHANNELS, 3, 2, norm=norm)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        blocks = []
        width = _STEM_CHANNELS
        for out_channels, count in zip(stage_channels, _BLOCKS_PER_STAGE):
            blocks.append(ShuffleV2Block(width, out_channels, 2, norm))
            blocks += [ShuffleV2Block(out_channels, out_channels, 1, norm) for _ in range(count - 1)]
            width = out_channels
        self.features = nn.Sequential(*blocks)
        self.conv_last = conv_norm_act(width, last_channels, 1, norm=norm)
        self.out_channels = last_channels
        self._init_weights()

    def _init_weights(self) -> None:
        """Megvii's init: stem conv N(0, 0.01), other convs N(0, 1 / input channels per group),
        BN weight 1 and bias 1e-4."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Conv2d):
                std = 0.01 if name.startswith("first_conv") else 1.0 / module.weight.shape[1]
                nn.init.normal_(module.weight, 0, std)
            elif isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm)):
                nn.init.ones_(module.weight)
                nn.init.constant_(module.bias, 1e-4)

    def forward(self, x: Tensor) -> Tensor:
        """Map images (B, 3, H, W) to (B, out_channels, ceil(H/32), ceil(W/32))."""
        x = self.maxpool(self.first_conv(x))
        return self.conv_last(self.features(x))


# ----------------------------------------------------------------------------- ImageNet weights
def is_shufflenetv2_file(state: Mapping[str, Tensor]) -> bool:
    """True for a ShuffleNetV2 file of Megvii's ShuffleNet-Series (or fast-reid)."""
    return "first_conv.0.weight" in state and "features.0.branch_proj.0.weight" in state


def is_torchvision_shufflenetv2_file(state: Mapping[str, Tensor]) -> bool:
    """True for torchvision's ShuffleNetV2 (conv1, stage2-4 with branch1 / branch2, conv5)."""
    return "conv1.0.weight" in state and "stage2.0.branch1.0.weight" in state


register_weights_family(WeightsFamily(
    name="ShuffleNetV2", fingerprint=is_shufflenetv2_file, dropped_prefixes=("classifier.",),
    releases="Megvii ShuffleNet-Series"))
# Known only to be recognised (and refused with its name): no backbone here builds it.
register_weights_family(WeightsFamily(
    name="torchvision's ShuffleNetV2 (another block design)", fingerprint=is_torchvision_shufflenetv2_file))


# ----------------------------------------------------------------------------- builder
def check_shufflenetv2_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (0.5x-2.0x), NORM, LAST_STRIDE and that no WITH_IBN /
    WITH_SE / WITH_NL is asked for, building nothing."""
    lookup(SHUFFLENETV2_DEPTHS, cfg.MODEL.BACKBONE.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, supported=())
    check_choice(cfg.MODEL.BACKBONE.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")


@BACKBONE_REGISTRY.register()
def build_shufflenetv2_backbone(cfg) -> ShuffleNetV2:
    """Build a ShuffleNetV2 from MODEL.BACKBONE.{DEPTH, NORM, PRETRAIN, PRETRAIN_PATH}
    (LAST_STRIDE is checked but, as in fast-reid, changes nothing: the output stride is 32).

    Args:
        cfg: the config tree.

    Returns:
        ShuffleNetV2 with `out_channels` 1024 (2048 for 2.0x).
    """
    opts = cfg.MODEL.BACKBONE
    check_shufflenetv2_config(cfg)
    model = ShuffleNetV2(SHUFFLENETV2_DEPTHS[opts.DEPTH], norm=opts.NORM)
    if opts.PRETRAIN:
        load_imagenet_weights(model, opts.PRETRAIN_PATH, "ShuffleNetV2")
    return model


build_shufflenetv2_backbone.check_config = check_shufflenetv2_config
