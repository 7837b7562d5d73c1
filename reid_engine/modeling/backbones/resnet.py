"""ResNet family (18x-152x) for ReID with last-stride, IBN-a, SE and non-local options.

Module names follow torchvision's ResNet (conv1, bn1, layerN.B.convK / bnK,
layerN.B.downsample.0/1; no fc) and fast-reid's additions (bn1.IN / bn1.BN for IBN-a,
se.fc.*, NL_2.i / NL_3.i), so fast-reid checkpoints and torchvision / IBN-Net
ImageNet weights load without key renaming. The trunk also serves ResNeXt (grouped
bottlenecks, see resnext.py).
"""
from typing import Any, Mapping, Optional, Sequence, Type

import torch
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.utils.registry import check_choice, lookup

from ..layers import IBN, NORM_NAMES, NonLocal, SELayer, get_norm, init_fan_out
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import load_imagenet_weights

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "build_resnet_backbone", "RESNET_DEPTHS"]


def _first_norm(planes: int, norm: str, with_ibn: bool) -> nn.Module:
    """The block's first norm: IBN-a when requested, else the plain norm."""
    return IBN(planes, norm) if with_ibn else get_norm(norm, planes)


class _ResidualBlock(nn.Module):
    """Shared forward of the residual blocks: relu(se(residual(x)) + shortcut(x))."""

    expansion = 1

    def __init__(self, out_channels: int, with_se: bool, downsample: Optional[nn.Module]):
        super().__init__()
        self.relu = nn.ReLU(inplace=True)
        self.se = SELayer(out_channels) if with_se else nn.Identity()
        self.downsample = downsample

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """The residual branch (defined by subclasses)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return relu(se(residual(x)) + shortcut(x))."""
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(self.se(self.residual(x)) + shortcut)


class BasicBlock(_ResidualBlock):
    """Two 3x3 convolutions (ResNet-18/34).

    Args:
        inplanes: input channels.
        planes: output channels.
        norm: norm name (see get_norm).
        with_ibn: IBN-a in place of bn1.
        with_se: squeeze-excitation on the residual branch.
        stride: stride of the first conv.
        downsample: shortcut projection or None.
    """

    expansion = 1

    def __init__(self, inplanes: int, planes: int, norm: str, with_ibn: bool = False,
                 with_se: bool = False, stride: int = 1, downsample: Optional[nn.Module] = None):
        super().__init__(planes, with_se, downsample)
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _first_norm(planes, norm, with_ibn)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = get_norm(norm, planes)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """conv3x3-norm-relu-conv3x3-norm."""
        out = self.relu(self.bn1(self.conv1(x)))
        return self.bn2(self.conv2(out))


class Bottleneck(_ResidualBlock):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4 (ResNet-50/101/152; with
    groups > 1 the 3x3 is grouped, as in ResNeXt).

    Args: as BasicBlock, plus
        groups: groups of the 3x3 conv (ResNeXt's cardinality).
        width_per_group: channels of each group when planes is 64 (ResNeXt's base width);
            the inner width is floor(planes * width_per_group / 64) * groups (planes for ResNet).
    The output has planes * 4 channels.
    """

    expansion = 4

    def __init__(self, inplanes: int, planes: int, norm: str, with_ibn: bool = False,
                 with_se: bool = False, stride: int = 1, downsample: Optional[nn.Module] = None,
                 *, groups: int = 1, width_per_group: int = 64):
        super().__init__(planes * self.expansion, with_se, downsample)
        width = planes * width_per_group // 64 * groups
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = _first_norm(width, norm, with_ibn)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn2 = get_norm(norm, width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = get_norm(norm, planes * self.expansion)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """conv1x1-norm-relu-conv3x3-norm-relu-conv1x1-norm."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.bn3(self.conv3(out))


class ResNet(nn.Module):
    """ResNet trunk returning the last stage's feature map.

    Args:
        block: BasicBlock or Bottleneck.
        blocks_per_stage: number of blocks in layer1..layer4.
        last_stride: stride of layer4 (1 keeps a 2x larger map, the ReID default).
        norm: norm name for every norm layer.
        with_ibn: IBN-a in bn1 of every block of the stages `ibn_stages`.
        with_se: squeeze-excitation in every block.
        non_local_per_stage: non-local blocks per stage, placed after that stage's
            last blocks (fast-reid's positions), held in NL_1..NL_4.
        ibn_stages: the stages (1-4) that get IBN-a; IBN-Net's rule (and fast-reid's
            ResNet) leaves layer4 out.
        block_options: extra keyword arguments of every block (e.g. ResNeXt's groups).
        stem_pool: the pooling after the stem; None gives fast-reid's ResNet pooling.
        base_channels: channels of the stem and of layer1's `planes`; the stages double it
            (64 is every published ResNet; 32 is a half-width one, a quarter of the FLOPs).
    """

    def __init__(self, block: Type[_ResidualBlock], blocks_per_stage: Sequence[int], *,
                 last_stride: int = 1, norm: str = "BN", with_ibn: bool = False,
                 with_se: bool = False, non_local_per_stage: Sequence[int] = (0, 0, 0, 0),
                 ibn_stages: Sequence[int] = (1, 2, 3), block_options: Optional[Mapping[str, Any]] = None,
                 stem_pool: Optional[nn.Module] = None, base_channels: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, base_channels, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = get_norm(norm, base_channels)
        self.relu = nn.ReLU(inplace=True)
        if stem_pool is None:
            # fast-reid's ResNet stem pooling (no padding, ceil_mode), so its checkpoints see
            # the same windows and map sizes: 256x128 -> 64x32 after the stem.
            stem_pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=0, ceil_mode=True)
        self.maxpool = stem_pool
        inplanes = base_channels
        stage_channels = []
        strides = (1, 2, 2, last_stride)
        for stage, (planes, count, stride) in enumerate(
                zip([base_channels * 2 ** i for i in range(4)], blocks_per_stage, strides), start=1):
            stage_ibn = with_ibn and stage in ibn_stages
            layer = self._make_stage(block, inplanes, planes, count, stride, norm, stage_ibn, with_se,
                                     block_options)
            setattr(self, f"layer{stage}", layer)
            inplanes = planes * block.expansion
            stage_channels.append(inplanes)
        self.out_channels = inplanes
        init_fan_out(self)
        # Non-local blocks are built after the trunk init: they keep their own
        # (identity-at-start) initialisation.
        for stage, count in enumerate(non_local_per_stage, start=1):
            layer = getattr(self, f"layer{stage}")
            if count > len(layer):
                raise ValueError(f"{count} non-local blocks asked for layer{stage}, "
                                 f"which has only {len(layer)} blocks")
            if count:
                setattr(self, f"NL_{stage}", nn.ModuleList(
                    NonLocal(stage_channels[stage - 1], norm) for _ in range(count)))

    @staticmethod
    def _make_stage(block, inplanes, planes, count, stride, norm, with_ibn, with_se,
                    block_options=None) -> nn.Sequential:
        """One stage: `count` blocks, the first with the stride and a projection shortcut."""
        options = dict(block_options or {})
        downsample = None
        if stride != 1 or inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * block.expansion, 1, stride=stride, bias=False),
                get_norm(norm, planes * block.expansion),
            )
        blocks = [block(inplanes, planes, norm, with_ibn, with_se, stride, downsample, **options)]
        blocks += [block(planes * block.expansion, planes, norm, with_ibn, with_se, **options)
                   for _ in range(1, count)]
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images (B, 3, H, W) to the layer4 feature map (B, out_channels, h, w)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in range(1, 5):
            layer = getattr(self, f"layer{stage}")
            non_local = getattr(self, f"NL_{stage}", ())
            first_with_nl = len(layer) - len(non_local)
            for index, block in enumerate(layer):
                x = block(x)
                if index >= first_with_nl:
                    x = non_local[index - first_with_nl](x)
        return x


#: depth -> (block type, blocks per stage)
RESNET_DEPTHS = {
    "18x": (BasicBlock, (2, 2, 2, 2)),
    "34x": (BasicBlock, (3, 4, 6, 3)),
    "50x": (Bottleneck, (3, 4, 6, 3)),
    "101x": (Bottleneck, (3, 4, 23, 3)),
    "152x": (Bottleneck, (3, 8, 36, 3)),
}

# fast-reid's non-local layouts (blocks per stage); other depths have none defined.
_NON_LOCAL_PER_STAGE = {
    "50x": (0, 2, 3, 0),
    "101x": (0, 2, 9, 0),
}


def check_resnet_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (a ResNet depth), NORM, LAST_STRIDE and WIDTH_MULT, building
    nothing."""
    lookup(RESNET_DEPTHS, cfg.MODEL.BACKBONE.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, ("WITH_IBN", "WITH_NL", "WITH_SE", "WIDTH_MULT"))
    check_choice(cfg.MODEL.BACKBONE.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")
    mult = cfg.MODEL.BACKBONE.WIDTH_MULT
    stem = 64 * mult
    if not (stem >= 8 and stem == int(stem) and int(stem) % 2 == 0):
        raise ConfigError(f"MODEL.BACKBONE.WIDTH_MULT {mult} gives {stem:g} stem channels; choose a "
                          f"multiple of 1/32 from 0.125 up (e.g. 0.5, 0.75, 1.0)")
    if mult != 1.0 and cfg.MODEL.BACKBONE.PRETRAIN:
        raise ConfigError(f"MODEL.BACKBONE.WIDTH_MULT {mult}: ImageNet ResNet weights exist for width "
                          f"1.0 only; set MODEL.BACKBONE.PRETRAIN False or WIDTH_MULT 1.0")


@BACKBONE_REGISTRY.register()
def build_resnet_backbone(cfg) -> ResNet:
    """Build a ResNet from MODEL.BACKBONE.{DEPTH, LAST_STRIDE, NORM, WITH_IBN, WITH_SE,
    WITH_NL, WIDTH_MULT, PRETRAIN, PRETRAIN_PATH}.

    Args:
        cfg: the config tree.

    Returns:
        ResNet with `out_channels` 512 (18x/34x) or 2048 (50x and deeper), times WIDTH_MULT.
    """
    opts = cfg.MODEL.BACKBONE
    check_resnet_config(cfg)
    non_local = (0, 0, 0, 0)
    if opts.WITH_NL:
        if opts.DEPTH not in _NON_LOCAL_PER_STAGE:
            raise ConfigError(f"MODEL.BACKBONE.WITH_NL: non-local blocks are defined for depths "
                              f"{', '.join(_NON_LOCAL_PER_STAGE)}, not {opts.DEPTH}; "
                              f"set WITH_NL False or change DEPTH")
        non_local = _NON_LOCAL_PER_STAGE[opts.DEPTH]
    block, blocks_per_stage = RESNET_DEPTHS[opts.DEPTH]
    model = ResNet(block, blocks_per_stage, last_stride=opts.LAST_STRIDE, norm=opts.NORM,
                   with_ibn=opts.WITH_IBN, with_se=opts.WITH_SE, non_local_per_stage=non_local,
                   base_channels=round(64 * opts.WIDTH_MULT))
    if opts.PRETRAIN:
        load_imagenet_weights(model, opts.PRETRAIN_PATH, "ResNet")
    return model


build_resnet_backbone.check_config = check_resnet_config
