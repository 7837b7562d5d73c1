"""OSNet (Omni-Scale Network) x1_0 / x0_75 / x0_5 / x0_25: fast-reid's OSNet with its IBN
variant, and torchreid's OSNet-AIN.

Zhou et al., "Omni-Scale Feature Learning for Person Re-Identification" (ICCV 2019) and
"Learning Generalisable Omni-Scale Representations for Person Re-Identification" (TPAMI 2021,
OSNet-AIN).

The trunk: a 7x7/2 conv and a 3x3/2 max pool, three stages of two omni-scale blocks (conv2,
conv3, conv4) with a 1x1 conv + 2x2 average pool transition after conv2 and conv3, and a
final 1x1 conv (conv5). An omni-scale block reduces the width by 4, runs four streams of 1,
2, 3 and 4 lite 3x3 convs (1x1 conv, depthwise 3x3, norm, ReLU), weights each stream by one
shared channel gate (global average pool, 1x1 conv to width/16, ReLU, 1x1 conv, sigmoid),
sums them, expands back with a 1x1 conv + norm and adds the (projected) input.

- WITH_IBN (OSNet-IBN, fast-reid's and torchreid's osnet_ibn): conv1's norm is an affine
  InstanceNorm, and both conv2 blocks add an affine InstanceNorm after the residual sum.
- DEPTH ain_x* (OSNet-AIN, torchreid's osnet_ain): conv1's norm is an affine InstanceNorm;
  the blocks conv2.0, conv2.1, conv3.1 and conv4.0 close their residual branch with an
  affine InstanceNorm in place of conv3's norm (IN before the sum); the others are plain.
  Pooling is the same as OSNet's (max pool in the stem, average-pool transitions).

Module names are torchreid's, which fast-reid keeps: fast-reid checkpoints (under
``backbone.``) and torchreid's ImageNet files load without renaming. In OSNet-AIN the
streams are ``conv2.<t>.layers.<i>`` and the transitions ``pool2`` / ``pool3`` (in OSNet they
are ``conv2a``, ``conv2b.<i>``, ..., and the last element of conv2 / conv3).

MODEL.BACKBONE.LAST_STRIDE has no effect, as in fast-reid: conv4 never downsamples, so the
output is always 1/16 of the input (16x8 for 256x128).
"""
import logging
from collections import OrderedDict
from typing import Container, Mapping, Optional, Sequence

from torch import Tensor, nn

from reid_engine.config import ConfigError
from reid_engine.utils.checkpoint import CheckpointError, CheckpointNotFoundError, load_checkpoint_file
from reid_engine.utils.registry import check_choice, lookup

from ..layers import NORM_NAMES, get_norm, init_fan_out
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import WeightsFamily, WeightsFamilyError, load_imagenet_weights, register_weights_family

__all__ = ["OSNET_DEPTHS", "ChannelGate", "LightConv3x3", "OSBlock", "OSNet", "build_osnet_backbone"]

logger = logging.getLogger(__name__)

# Channels of conv1, conv2, conv3 and conv4 (= conv5, the output) per width multiplier.
_WIDTHS = {
    "x1_0": (64, 256, 384, 512),
    "x0_75": (48, 192, 288, 384),
    "x0_5": (32, 128, 192, 256),
    "x0_25": (16, 64, 96, 128),
}
_AIN_PREFIX = "ain_"

#: DEPTH -> (is OSNet-AIN, channels of conv1..conv4)
OSNET_DEPTHS = {**{width: (False, channels) for width, channels in _WIDTHS.items()},
                **{_AIN_PREFIX + width: (True, channels) for width, channels in _WIDTHS.items()}}

# Where the blocks of conv2, conv3 and conv4 put an InstanceNorm: None, "output" (after the
# residual sum) or "residual" (closing the residual branch, in place of conv3's norm).
_OSNET_BLOCKS = ((None, None), (None, None), (None, None))
_IBN_BLOCKS = (("output", "output"), (None, None), (None, None))
_AIN_BLOCKS = (("residual", "residual"), (None, "residual"), ("residual", None))

# Streams of 1..4 lite 3x3 convs: receptive fields 3, 5, 7, 9.
_STREAM_DEPTHS = (1, 2, 3, 4)


def _instance_norm(channels: int) -> nn.Module:
    """Affine InstanceNorm without running statistics (torchreid's: weight and bias only)."""
    return nn.InstanceNorm2d(channels, affine=True)


class ConvNormAct(nn.Module):
    """Convolution (no bias), a norm and an optional ReLU: torchreid's ConvLayer / Conv1x1 /
    Conv1x1Linear, with their names ``conv`` and ``bn``.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: square kernel size (padding keeps the size at stride 1).
        norm: the norm layer over out_channels, or None for none (OSNet-AIN's conv3 before IN).
        stride: convolution stride.
        relu: end with a ReLU.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, norm: Optional[nn.Module],
                 stride: int = 1, relu: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=kernel_size // 2, bias=False)
        self.bn = norm if norm is not None else nn.Identity()
        self.relu = nn.ReLU(inplace=True) if relu else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """conv-norm(-relu)."""
        return self.relu(self.bn(self.conv(x)))


class LightConv3x3(nn.Module):
    """OSNet's lite 3x3 conv: 1x1 conv (linear), depthwise 3x3 conv, norm, ReLU.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        norm: norm name (see get_norm).
    """

    def __init__(self, in_channels: int, out_channels: int, norm: str):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False, groups=out_channels)
        self.bn = get_norm(norm, out_channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        """conv1x1-dwconv3x3-norm-relu."""
        return self.relu(self.bn(self.conv2(self.conv1(x))))


def _lite_convs(channels: int, depth: int, norm: str) -> nn.Sequential:
    """A stream of `depth` lite 3x3 convs."""
    return nn.Sequential(*(LightConv3x3(channels, channels, norm) for _ in range(depth)))


class _NamedStream(nn.Module):
    """A stream wrapped under ``layers``: torchreid osnet_ain's LightConvStream, for its key names."""

    def __init__(self, channels: int, depth: int, norm: str):
        super().__init__()
        self.layers = _lite_convs(channels, depth, norm)

    def forward(self, x: Tensor) -> Tensor:
        """Run the stream."""
        return self.layers(x)


class ChannelGate(nn.Module):
    """Channel gate shared by the streams of a block: x * sigmoid(fc2(relu(fc1(avgpool(x))))).

    Args:
        channels: input (and gate) channels.
        reduction: fc1 maps to channels // reduction.
    """

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        self.global_avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, channels // reduction, 1, bias=True)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(channels // reduction, channels, 1, bias=True)
        self.gate_activation = nn.Sigmoid()

    def forward(self, x: Tensor) -> Tensor:
        """Scale each channel of x (B, C, H, W) by its gate in (0, 1)."""
        gates = self.fc2(self.relu(self.fc1(self.global_avgpool(x))))
        return x * self.gate_activation(gates)


class OSBlock(nn.Module):
    """Omni-scale residual block: relu(conv3(sum_t gate(stream_t(conv1(x)))) + shortcut(x)).

    Args:
        in_channels: input channels.
        out_channels: output channels (the streams run at out_channels // 4).
        norm: norm name (see get_norm).
        instance_norm: None; "output": an affine InstanceNorm after the residual sum
            (OSNet-IBN); "residual": an affine InstanceNorm closing the residual branch,
            in place of conv3's norm (OSNet-AIN's OSBlockINin).
        ain_names: name the streams ``conv2.<t>.layers.<i>`` (torchreid's osnet_ain) rather
            than ``conv2a``, ``conv2b.<i>``, ``conv2c.<i>``, ``conv2d.<i>`` (osnet, fast-reid).
    """

    def __init__(self, in_channels: int, out_channels: int, norm: str, *,
                 instance_norm: Optional[str] = None, ain_names: bool = False):
        super().__init__()
        if instance_norm not in (None, "output", "residual"):
            raise ValueError(f"instance_norm must be None, 'output' or 'residual', got {instance_norm!r}")
        mid_channels = out_channels // 4
        self.conv1 = ConvNormAct(in_channels, mid_channels, 1, get_norm(norm, mid_channels))
        self.ain_names = ain_names
        if ain_names:
            self.conv2 = nn.ModuleList(_NamedStream(mid_channels, depth, norm) for depth in _STREAM_DEPTHS)
        else:
            self.conv2a = LightConv3x3(mid_channels, mid_channels, norm)  # a single conv: no Sequential
            self.conv2b, self.conv2c, self.conv2d = (_lite_convs(mid_channels, depth, norm)
                                                     for depth in _STREAM_DEPTHS[1:])
        self.gate = ChannelGate(mid_channels)
        conv3_norm = None if instance_norm == "residual" else get_norm(norm, out_channels)
        self.conv3 = ConvNormAct(mid_channels, out_channels, 1, conv3_norm, relu=False)
        self.downsample = None
        if in_channels != out_channels:
            self.downsample = ConvNormAct(in_channels, out_channels, 1, get_norm(norm, out_channels), relu=False)
        self.instance_norm = instance_norm
        self.IN = _instance_norm(out_channels) if instance_norm else None
        self.relu = nn.ReLU(inplace=True)

    def streams(self) -> Sequence[nn.Module]:
        """The four streams, of 1, 2, 3 and 4 lite 3x3 convs."""
        if self.ain_names:
            return tuple(self.conv2)
        return self.conv2a, self.conv2b, self.conv2c, self.conv2d

    def forward(self, x: Tensor) -> Tensor:
        """Map (B, in_channels, H, W) to (B, out_channels, H, W)."""
        reduced = self.conv1(x)
        # one gate for all streams: it weighs the scales per channel and per image
        fused = sum(self.gate(stream(reduced)) for stream in self.streams())
        residual = self.conv3(fused)
        if self.instance_norm == "residual":
            residual = self.IN(residual)
        shortcut = x if self.downsample is None else self.downsample(x)
        out = residual + shortcut
        if self.instance_norm == "output":
            out = self.IN(out)
        return self.relu(out)


def _transition(channels: int, norm: str) -> nn.Sequential:
    """1x1 conv-norm-relu, then a 2x2 average pool halving the map."""
    return nn.Sequential(ConvNormAct(channels, channels, 1, get_norm(norm, channels)),
                         nn.AvgPool2d(2, stride=2))


class OSNet(nn.Sequential):
    """OSNet trunk returning conv5's map (stride 16).

    The trunk is a plain chain, so it is an nn.Sequential of named stages: conv1, maxpool,
    conv2, conv3, conv4, conv5 (and pool2 / pool3 between the stages for OSNet-AIN).

    Args:
        channels: channels of conv1, conv2, conv3 and conv4 / conv5.
        norm: norm name for every norm layer that is not an InstanceNorm.
        with_ibn: OSNet-IBN: InstanceNorm in conv1 and after the sum of conv2's blocks.
        ain: OSNet-AIN (torchreid's osnet_ain, its module names): InstanceNorm in conv1 and
            in the residual branch of conv2.0, conv2.1, conv3.1 and conv4.0.
    """

    def __init__(self, channels: Sequence[int], norm: str = "BN", *, with_ibn: bool = False, ain: bool = False):
        if with_ibn and ain:
            raise ValueError("OSNet-AIN has its own instance norms: with_ibn and ain exclude each other")
        stem, widths = channels[0], tuple(channels)
        stem_norm = _instance_norm(stem) if (with_ibn or ain) else get_norm(norm, stem)
        plan = _AIN_BLOCKS if ain else _IBN_BLOCKS if with_ibn else _OSNET_BLOCKS
        stages = OrderedDict(conv1=ConvNormAct(3, stem, 7, stem_norm, stride=2),
                             maxpool=nn.MaxPool2d(3, stride=2, padding=1))
        for index, (in_ch, out_ch, norms) in enumerate(zip(widths[:-1], widths[1:], plan)):
            number = index + 2
            blocks = [OSBlock(in_ch if i == 0 else out_ch, out_ch, norm, instance_norm=placement, ain_names=ain)
                      for i, placement in enumerate(norms)]
            halves = number < 4  # conv2 and conv3 end with a transition; conv4 keeps its size
            if halves and not ain:  # OSNet: the transition is the stage's last element
                blocks.append(_transition(out_ch, norm))
            stages[f"conv{number}"] = nn.Sequential(*blocks)
            if halves and ain:  # OSNet-AIN: a stage of its own
                stages[f"pool{number}"] = _transition(out_ch, norm)
        stages["conv5"] = ConvNormAct(widths[-1], widths[-1], 1, get_norm(norm, widths[-1]))
        super().__init__(stages)
        self.out_channels = widths[-1]
        init_fan_out(self)


def check_osnet_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (an OSNet width, optionally ain_), NORM, LAST_STRIDE and
    WITH_* (only WITH_IBN, and not with OSNet-AIN), building nothing."""
    opts = cfg.MODEL.BACKBONE
    ain, _ = lookup(OSNET_DEPTHS, opts.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, ("WITH_IBN",))
    check_choice(opts.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")
    if ain and opts.WITH_IBN:
        raise ConfigError(f"MODEL.BACKBONE.WITH_IBN is True, but DEPTH {opts.DEPTH} (OSNet-AIN) has its own "
                          f"instance norms; set WITH_IBN False, or DEPTH {opts.DEPTH[len(_AIN_PREFIX):]} for OSNet-IBN")


@BACKBONE_REGISTRY.register()
def build_osnet_backbone(cfg) -> OSNet:
    """Build an OSNet from MODEL.BACKBONE.{DEPTH, NORM, WITH_IBN, PRETRAIN, PRETRAIN_PATH}.

    DEPTH x1_0 / x0_75 / x0_5 / x0_25 (OSNet, OSNet-IBN with WITH_IBN) or ain_x1_0 /
    ain_x0_75 / ain_x0_5 / ain_x0_25 (OSNet-AIN). LAST_STRIDE has no effect (as in fast-reid).

    Args:
        cfg: the config tree.

    Returns:
        OSNet with `out_channels` 512 / 384 / 256 / 128 for x1_0 / x0_75 / x0_5 / x0_25.
    """
    opts = cfg.MODEL.BACKBONE
    check_osnet_config(cfg)
    if opts.LAST_STRIDE != 1:
        logger.info("MODEL.BACKBONE.LAST_STRIDE %s has no effect on OSNet (as in fast-reid): conv4 keeps "
                    "its input size, the output is 1/16 of the image", opts.LAST_STRIDE)
    ain, channels = OSNET_DEPTHS[opts.DEPTH]
    model = OSNet(channels, opts.NORM, with_ibn=opts.WITH_IBN, ain=ain)
    if opts.PRETRAIN:
        _refuse_other_variant(opts.PRETRAIN_PATH, opts.DEPTH, opts.WITH_IBN)
        load_imagenet_weights(model, opts.PRETRAIN_PATH, "OSNet")
    return model


build_osnet_backbone.check_config = check_osnet_config


def _variant(ain: bool, with_ibn: bool) -> str:
    return "OSNet-AIN" if ain else "OSNet-IBN" if with_ibn else "OSNet"


def _file_variant(state: Mapping[str, Tensor]) -> Optional[str]:
    """The OSNet variant of a torchreid ImageNet state dict, None when it is no OSNet file."""
    keys = {key[len("module."):] if key.startswith("module.") else key for key in state}
    if not _is_torchreid_osnet(keys):
        return None
    return _variant(ain="conv2.0.conv2.0.layers.0.conv1.weight" in keys, with_ibn="conv2.0.IN.weight" in keys)


def _refuse_other_variant(path: str, depth: str, with_ibn: bool) -> None:
    """Refuse a torchreid file of another OSNet variant (plain / IBN / AIN) before loading it.

    Such a file mostly fits, so the loader would take it silently, or torch would fail on
    BatchNorm statistics for conv1's InstanceNorm; a one-line error says which file to use.
    Unreadable or missing files are left to load_imagenet_weights, which reports them.
    """
    try:
        found = _file_variant(load_checkpoint_file(path)["model"])
    except (CheckpointError, CheckpointNotFoundError):
        return
    ain, _ = OSNET_DEPTHS[depth]
    wanted = _variant(ain, with_ibn)
    if found is None or found == wanted:
        return
    width = depth[len(_AIN_PREFIX):] if ain else depth
    fix = {"OSNet": f"WITH_IBN False and DEPTH {width}", "OSNet-IBN": f"WITH_IBN True and DEPTH {width}",
           "OSNet-AIN": f"WITH_IBN False and DEPTH {_AIN_PREFIX}{width}"}[found]
    release = "osnet_" + ("ibn_" if with_ibn else "") + depth + "_imagenet.pth"
    raise WeightsFamilyError(
        f"MODEL.BACKBONE.PRETRAIN_PATH: {path} holds {found} weights, but the backbone is {wanted} "
        f"(DEPTH {depth}, WITH_IBN {with_ibn}); point it to torchreid's {release} or set {fix}")


def _is_torchreid_osnet(state: Container[str]) -> bool:
    # the omni-scale block's shared channel gate, with torchreid's stem and final conv
    return all(key in state for key in ("conv1.conv.weight", "conv2.0.gate.fc1.weight", "conv5.conv.weight"))


# torchreid's trunk names are ours (fast-reid kept them), so no renaming; its feature fc
# (Linear + BatchNorm1d + ReLU) and the ImageNet classifier are dropped.
register_weights_family(WeightsFamily(
    name="OSNet", fingerprint=_is_torchreid_osnet, dropped_prefixes=("fc.", "classifier."),
    releases="torchreid osnet / osnet_ibn / osnet_ain"))
