"""RepVGG family (A0-A2, B0-B3 and the grouped B*g2 / B*g4) for ReID, in training and deploy form.

A RepVGG block trains with three parallel branches whose sum goes through a ReLU: a 3x3
conv + norm (`rbr_dense`), a 1x1 conv + norm (`rbr_1x1`) and, where input and output
match (same width, stride 1), a bare norm (`rbr_identity`). All three are linear in the
input once the norms use their running statistics, so for inference they fold into one
3x3 conv with a bias (`rbr_reparam`, the deploy form of Ding et al.'s release):
`RepVGGBlock.fuse_for_deploy()` does that in place, and `reid_engine.modeling.deploy.
fuse_for_deploy(model)` does it for every block of a model.

Module names are fast-reid's and the authors' (stage0 = one block, stage1..stage4 =
sequences of blocks), so fast-reid checkpoints and DingXiaoH/RepVGG `*-train.pth`
ImageNet files load without renaming; timm's `repvgg_*` names are mapped. A checkpoint
saved after fusion (`rbr_reparam`, or fast-reid's fused `fused_weight` / `fused_bias`)
also loads into a model built in training form: each block that finds fused weights
for itself switches to the deploy form before it loads them.
"""
import logging
from collections import OrderedDict
from typing import Dict, Mapping, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.utils.errors import ReidUserError
from reid_engine.utils.registry import check_choice, lookup

from ..layers import NORM_NAMES, get_norm
from .build import BACKBONE_REGISTRY, check_backbone_options
from .imagenet_weights import WeightsFamily, load_imagenet_weights, register_weights_family, rename_keys

__all__ = ["REPVGG_DEPTHS", "RepVGGSpec", "RepVGGBlock", "RepVGG", "FusionError", "build_repvgg_backbone"]

logger = logging.getLogger(__name__)

# fast-reid's names of a block's fused conv (its deploy(True)) -> ours (the authors' deploy form)
_FASTREID_FUSED_NAMES = {"fused_weight": "rbr_reparam.weight", "fused_bias": "rbr_reparam.bias"}
_FUSED_WEIGHT_SUFFIXES = (".rbr_reparam.weight", ".fused_weight")


class FusionError(ReidUserError, ValueError):
    """A block cannot be folded into one convolution (its norm has no running statistics)."""


def _conv_norm(in_channels: int, out_channels: int, kernel_size: int, stride: int, groups: int,
               norm: str) -> nn.Sequential:
    """conv (no bias) + norm, as children `conv` and `bn` (the release's key names)."""
    return nn.Sequential(OrderedDict(
        conv=nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2,
                       groups=groups, bias=False),
        bn=get_norm(norm, out_channels),
    ))


def _folded(kernel: torch.Tensor, norm: nn.Module) -> Tuple[torch.Tensor, torch.Tensor]:
    """(kernel, bias) of conv-with-`kernel` followed by `norm` in eval mode, in float64.

    Raises:
        FusionError: `norm` keeps no running statistics (GroupNorm, or BN without them).
    """
    stats = [getattr(norm, attr, None) for attr in ("running_mean", "running_var", "weight", "bias")]
    if any(stat is None for stat in stats):
        raise FusionError(f"a RepVGG block normalises with {type(norm).__name__}, which has no running statistics "
                          "and cannot be folded into a convolution; build with MODEL.BACKBONE.NORM BN "
                          "(or syncBN / FrozenBN / GhostBN) to fuse, or use the model unfused")
    mean, var, weight, bias = (stat.detach().double() for stat in stats)
    scale = weight / torch.sqrt(var + norm.eps)
    return kernel.double() * scale.view(-1, 1, 1, 1), bias - mean * scale


class RepVGGBlock(nn.Module):
    """relu(dense3x3(x) + conv1x1(x) [+ norm(x)]), or relu(rbr_reparam(x)) once fused.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        norm: norm name (see get_norm) of every branch.
        stride: stride of the 3x3 and 1x1 branches; the identity branch exists only
            with stride 1 and in_channels == out_channels.
        groups: groups of both convolutions.
    """

    def __init__(self, in_channels: int, out_channels: int, norm: str = "BN", stride: int = 1, groups: int = 1):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.stride, self.groups = stride, groups
        # Registration order (identity, dense, 1x1) gives fast-reid's state-dict order.
        self.rbr_identity: Optional[nn.Module] = (
            get_norm(norm, in_channels) if in_channels == out_channels and stride == 1 else None)
        self.rbr_dense: Optional[nn.Module] = _conv_norm(in_channels, out_channels, 3, stride, groups, norm)
        self.rbr_1x1: Optional[nn.Module] = _conv_norm(in_channels, out_channels, 1, stride, groups, norm)
        self.rbr_reparam: Optional[nn.Conv2d] = None
        self.relu = nn.ReLU(inplace=True)

    @property
    def is_fused(self) -> bool:
        """True in deploy form (one 3x3 conv with bias)."""
        return self.rbr_reparam is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (B, in_channels, H, W) to (B, out_channels, H / stride, W / stride)."""
        if self.rbr_reparam is not None:
            return self.relu(self.rbr_reparam(x))
        out = self.rbr_dense(x) + self.rbr_1x1(x)
        if self.rbr_identity is not None:
            out = out + self.rbr_identity(x)
        return self.relu(out)

    def _identity_kernel(self) -> torch.Tensor:
        """The 3x3 (grouped) kernel that copies each input channel to the same output channel."""
        per_group = self.in_channels // self.groups
        kernel = torch.zeros(self.in_channels, per_group, 3, 3, dtype=torch.float64)
        channels = torch.arange(self.in_channels)
        kernel[channels, channels % per_group, 1, 1] = 1.0
        return kernel

    def equivalent_kernel_bias(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The (kernel, bias) of the one 3x3 conv equal to the three branches in eval mode.

        Computed in float64; returned in the dtype and on the device of the 3x3 weight.

        Raises:
            FusionError: a branch's norm cannot be folded (GroupNorm).
        """
        dense, one_by_one = self.rbr_dense.conv.weight, self.rbr_1x1.conv.weight
        kernel, bias = _folded(dense.detach(), self.rbr_dense.bn)
        kernel_1x1, bias_1x1 = _folded(F.pad(one_by_one.detach(), [1, 1, 1, 1]), self.rbr_1x1.bn)
        kernel, bias = kernel + kernel_1x1, bias + bias_1x1
        if self.rbr_identity is not None:
            identity = self._identity_kernel().to(dense.device)
            kernel_id, bias_id = _folded(identity, self.rbr_identity)
            kernel, bias = kernel + kernel_id, bias + bias_id
        return kernel.to(dense.dtype), bias.to(dense.dtype)

    def _switch_to_deploy_layout(self, like: torch.Tensor) -> None:
        """Replace the branches by an (uninitialised) `rbr_reparam` on `like`'s device and dtype."""
        self.rbr_reparam = nn.Conv2d(self.in_channels, self.out_channels, 3, stride=self.stride, padding=1,
                                     groups=self.groups, bias=True, device=like.device, dtype=like.dtype)
        self.rbr_dense = self.rbr_1x1 = self.rbr_identity = None

    @torch.no_grad()
    def fuse_for_deploy(self) -> bool:
        """Fold the branches and their norms' running statistics into `rbr_reparam`, in place.

        The deploy hook of `reid_engine.modeling.deploy.fuse_for_deploy`. The block then
        computes what it computed before in eval mode.

        Returns:
            True when it fused; False when it already was in deploy form.
        Raises:
            FusionError: a norm cannot be folded (GroupNorm); the block is left unchanged.
        """
        if self.is_fused:
            return False
        kernel, bias = self.equivalent_kernel_bias()
        self._switch_to_deploy_layout(kernel)
        self.rbr_reparam.weight.copy_(kernel)
        self.rbr_reparam.bias.copy_(bias)
        return True

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A checkpoint saved after fusion holds this block's weights in deploy form: take
        # fast-reid's fused names too, and switch to the deploy form to load them when the
        # shapes fit (else the keys stay unexpected and the loader's summary names them).
        for theirs, ours in _FASTREID_FUSED_NAMES.items():
            if prefix + theirs in state_dict and prefix + ours not in state_dict:
                state_dict[prefix + ours] = state_dict.pop(prefix + theirs)
        weight = state_dict.get(prefix + "rbr_reparam.weight")
        expected = (self.out_channels, self.in_channels // self.groups, 3, 3)
        if not self.is_fused and weight is not None and tuple(weight.shape) == expected:
            self._switch_to_deploy_layout(self.rbr_dense.conv.weight)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class RepVGGSpec(NamedTuple):
    """A RepVGG depth: blocks of stage1..4, width multipliers of stage1..4 (of 64, 128,
    256, 512 channels) and the groups of the grouped layers (1 = none)."""

    blocks_per_stage: Tuple[int, int, int, int]
    width_multipliers: Tuple[float, float, float, float]
    groups: int = 1


_A_BLOCKS = (2, 4, 14, 1)
_B_BLOCKS = (4, 6, 16, 1)

#: DEPTH -> RepVGGSpec (fast-reid's and the paper's table)
REPVGG_DEPTHS: Dict[str, RepVGGSpec] = {
    "A0": RepVGGSpec(_A_BLOCKS, (0.75, 0.75, 0.75, 2.5)),
    "A1": RepVGGSpec(_A_BLOCKS, (1, 1, 1, 2.5)),
    "A2": RepVGGSpec(_A_BLOCKS, (1.5, 1.5, 1.5, 2.75)),
    "B0": RepVGGSpec(_B_BLOCKS, (1, 1, 1, 2.5)),
    "B1": RepVGGSpec(_B_BLOCKS, (2, 2, 2, 4)),
    "B1g2": RepVGGSpec(_B_BLOCKS, (2, 2, 2, 4), 2),
    "B1g4": RepVGGSpec(_B_BLOCKS, (2, 2, 2, 4), 4),
    "B2": RepVGGSpec(_B_BLOCKS, (2.5, 2.5, 2.5, 5)),
    "B2g2": RepVGGSpec(_B_BLOCKS, (2.5, 2.5, 2.5, 5), 2),
    "B2g4": RepVGGSpec(_B_BLOCKS, (2.5, 2.5, 2.5, 5), 4),
    "B3": RepVGGSpec(_B_BLOCKS, (3, 3, 3, 5)),
    "B3g2": RepVGGSpec(_B_BLOCKS, (3, 3, 3, 5), 2),
    "B3g4": RepVGGSpec(_B_BLOCKS, (3, 3, 3, 5), 4),
}

# The layers that g2 / g4 depths group, counting the blocks of stage1..4 from 1: every
# second one (always a block with as many inputs as outputs).
_GROUPED_LAYERS = frozenset(range(2, 27, 2))
_BASE_WIDTHS = (64, 128, 256, 512)


def _stage_widths(spec: RepVGGSpec) -> Tuple[int, ...]:
    """Output channels of stage0..stage4."""
    widths = tuple(int(base * mult) for base, mult in zip(_BASE_WIDTHS, spec.width_multipliers))
    return (min(64, widths[0]),) + widths


class RepVGG(nn.Module):
    """RepVGG trunk: stage0 (one stride-2 block) and stage1..stage4, returning the last map.

    Args:
        spec: the depth's blocks, widths and groups (see REPVGG_DEPTHS).
        last_stride: stride of stage4 (1 keeps a 2x larger map, the ReID default).
        norm: norm name for every norm layer.
    """

    def __init__(self, spec: RepVGGSpec, last_stride: int = 1, norm: str = "BN"):
        super().__init__()
        widths = _stage_widths(spec)
        self.stage0 = RepVGGBlock(3, widths[0], norm, stride=2)
        in_channels, layer = widths[0], 1
        for stage, (count, width) in enumerate(zip(spec.blocks_per_stage, widths[1:]), start=1):
            blocks = []
            for index in range(count):
                stride = (last_stride if stage == 4 else 2) if index == 0 else 1
                groups = spec.groups if layer in _GROUPED_LAYERS else 1
                blocks.append(RepVGGBlock(in_channels, width, norm, stride=stride, groups=groups))
                in_channels, layer = width, layer + 1
            setattr(self, f"stage{stage}", nn.Sequential(*blocks))
        self.out_channels = in_channels
        # PyTorch's default init, as the authors and fast-reid train RepVGG (norm weight 1, bias 0).

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Said once per trunk (each block switches itself): a model that loads fused weights
        # is meant for inference; trained, its blocks would be plain 3x3 convs.
        fused = sum(1 for key in state_dict if key.startswith(prefix) and key.endswith(_FUSED_WEIGHT_SUFFIXES))
        if fused:
            logger.info("%d RepVGG blocks load fused (deploy-form) weights: they run as one 3x3 conv each, "
                        "for inference and export", fused)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images (B, 3, H, W) to the stage4 map (B, out_channels, H/16 or H/32, ...)."""
        x = self.stage0(x)
        for stage in range(1, 5):
            x = getattr(self, f"stage{stage}")(x)
        return x


def check_repvgg_config(cfg) -> None:
    """Check MODEL.BACKBONE.DEPTH (a RepVGG depth), NORM, LAST_STRIDE and the WITH_* keys
    (RepVGG has none), building nothing."""
    opts = cfg.MODEL.BACKBONE
    spec = lookup(REPVGG_DEPTHS, opts.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, ())
    check_choice(opts.NORM, NORM_NAMES, "MODEL.BACKBONE.NORM")
    if opts.NORM == "GN":
        odd = sorted({w for w in _stage_widths(spec) if w % 32})
        if odd:
            raise ConfigError(f"MODEL.BACKBONE.NORM GN needs widths divisible by 32, but RepVGG-{opts.DEPTH} "
                              f"has {', '.join(map(str, odd))}; use another NORM or DEPTH")


@BACKBONE_REGISTRY.register()
def build_repvgg_backbone(cfg) -> RepVGG:
    """Build a RepVGG (training form) from MODEL.BACKBONE.{DEPTH, LAST_STRIDE, NORM,
    PRETRAIN, PRETRAIN_PATH}.

    Args:
        cfg: the config tree; DEPTH is one of REPVGG_DEPTHS (A0 ... B3g4).

    Returns:
        RepVGG with `out_channels` int(512 x the depth's last width multiplier) (1280 for A0).
    """
    opts = cfg.MODEL.BACKBONE
    check_repvgg_config(cfg)
    model = RepVGG(REPVGG_DEPTHS[opts.DEPTH], last_stride=opts.LAST_STRIDE, norm=opts.NORM)
    if opts.PRETRAIN:
        load_imagenet_weights(model, opts.PRETRAIN_PATH, "RepVGG")
    return model


build_repvgg_backbone.check_config = check_repvgg_config


# ----------------------------------------------------------------------------- ImageNet weights

# timm (byobnet) names -> the authors' (ours): the stem is stage0, stages.N is stage(N+1),
# the branches are conv_kxk / conv_1x1 / identity, the deploy conv is reparam_conv.
_TIMM_NAMES = (
    (r"^stem\.", "stage0."),
    (r"^stages\.(\d+)\.", lambda m: f"stage{int(m.group(1)) + 1}."),
    (r"\.conv_kxk\.", ".rbr_dense."),
    (r"\.conv_1x1\.", ".rbr_1x1."),
    (r"\.identity\.", ".rbr_identity."),
    (r"\.reparam_conv\.", ".rbr_reparam."),
)


def _from_timm_names(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Rename a timm `repvgg_*` state dict to ours (the authors' release needs nothing)."""
    if "stem.conv_kxk.conv.weight" not in state and "stem.reparam_conv.weight" not in state:
        return state
    return rename_keys(state, _TIMM_NAMES)


def _is_repvgg_train_file(state: Mapping[str, torch.Tensor]) -> bool:
    # The stem block's 3x3 and 1x1 branches, in the authors' or timm's names.
    return (("stage0.rbr_dense.conv.weight" in state and "stage0.rbr_1x1.conv.weight" in state)
            or ("stem.conv_kxk.conv.weight" in state and "stem.conv_1x1.conv.weight" in state))


def _is_repvgg_deploy_file(state: Mapping[str, torch.Tensor]) -> bool:
    # One fused 3x3 conv per block: the authors' rbr_reparam or timm's reparam_conv.
    return "stage0.rbr_reparam.weight" in state or "stem.reparam_conv.weight" in state


register_weights_family(WeightsFamily(
    name="RepVGG", fingerprint=_is_repvgg_train_file, rename=_from_timm_names,
    dropped_prefixes=("linear.", "head."),
    releases="training form: DingXiaoH/RepVGG RepVGG-<DEPTH>-train.pth or timm repvgg_*"))

# Recognised only to say what it is: ImageNet training starts from the branches (the
# training form); a fused file cannot be split back into them.
register_weights_family(WeightsFamily(
    name="RepVGG deploy-form (fused)", fingerprint=_is_repvgg_deploy_file,
    releases="DingXiaoH/RepVGG RepVGG-<DEPTH>-deploy.pth or a reparameterized timm repvgg_*"))
