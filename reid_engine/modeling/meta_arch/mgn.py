"""MGN (Multiple Granularity Network): a ResNet trunk, three branches, eight heads.

fast-reid's layout, so its MGN checkpoints load unchanged: the trunk ``backbone`` is the
ResNet stem and layer1-3 up to the first block of layer3 (``backbone.0`` .. ``backbone.6``);
each branch ``b1``, ``b2``, ``b3`` holds its own copy of the rest of layer3 (``bN.0``) and
of layer4 (``bN.1``): b1 with MODEL.BACKBONE.LAST_STRIDE, b2 and b3 with stride 1 so
their maps keep enough rows for the stripes. ``b1_head`` sees b1's whole map; b2's map
is seen whole by ``b2_head`` and as 2 horizontal stripes by ``b21_head``/``b22_head``;
b3's whole by ``b3_head`` and as 3 stripes by ``b31_head``..``b33_head``.
"""
import copy
import operator
from typing import Callable, Dict, Mapping, Sequence, Tuple, Union

import torch
from torch import nn

from reid_engine.config import ConfigError

from ..backbones.build import build_backbone
from ..heads.build import build_heads
from ..losses.build import LossSet, ReidLoss, build_losses
from .base import ReidModelBase, check_parts_config, require_backbone
from .build import META_ARCH_REGISTRY

__all__ = ["MGN", "MGNLosses", "horizontal_stripes", "stride_one_copy", "MGN_HEADS", "MGN_STRIPES", "MGN_TEST_ORDER"]

#: number of horizontal stripes of each branch's map
MGN_STRIPES = {"b1": 1, "b2": 2, "b3": 3}

#: head name -> (branch, index of its stripe or None for the whole map)
MGN_HEADS = {
    "b1_head": ("b1", None),
    "b2_head": ("b2", None),
    "b21_head": ("b2", 0),
    "b22_head": ("b2", 1),
    "b3_head": ("b3", None),
    "b31_head": ("b3", 0),
    "b32_head": ("b3", 1),
    "b33_head": ("b3", 2),
}

#: heads whose test features are concatenated, in fast-reid's order (globals first)
MGN_TEST_ORDER = ("b1_head", "b2_head", "b3_head", "b21_head", "b22_head", "b31_head", "b32_head", "b33_head")

#: metric-loss feature sets (loss-name suffix -> heads whose training features are concatenated):
#: the three global features, and the stripes of b2 and of b3 taken together
_METRIC_SETS = {"b1": ("b1_head",), "b2": ("b2_head",), "b3": ("b3_head",),
                "b22": ("b21_head", "b22_head"), "b33": ("b31_head", "b32_head", "b33_head")}

# fast-reid's weights: each classification loss is averaged over the eight heads, each
# metric loss over the five feature sets.
_CLASSIFICATION_WEIGHT = 1.0 / len(MGN_HEADS)
_METRIC_WEIGHT = 1.0 / len(_METRIC_SETS)

# MODEL.BACKBONE.NAME values MGN can split into trunk and branches.
_SPLITTABLE_BACKBONES = ("build_resnet_backbone",)

HeadOutputs = Dict[str, torch.Tensor]


def horizontal_stripes(feature_map: torch.Tensor, count: int) -> Tuple[torch.Tensor, ...]:
    """Split a (B, C, H, W) map into `count` horizontal stripes, top to bottom.

    The stripes are torch.chunk's (fast-reid's): ceil(H / count) rows each, the last one
    the rest, e.g. 16 rows -> 6, 6, 4 (so fast-reid's checkpoints see the same stripes).
    The height is taken with operator.index, which torch.compile specialises (a constant of
    the graph, guarded): the stripes keep static sizes when other dimensions are dynamic
    (inductor failed to decide size tests on products of symbolic stripe heights).

    Raises:
        ConfigError: H gives fewer than `count` stripes (the input images are too small).
    """
    rows = operator.index(feature_map.shape[2])
    step = -(-rows // count)  # torch.chunk's ceil(H / count)
    if (count - 1) * step >= rows:
        raise ConfigError(f"MGN cannot cut a feature map of {rows} rows into {count} "
                          "stripes; use taller images (INPUT.SIZE_TRAIN / INPUT.SIZE_TEST, e.g. 256x128 or 384x128)")
    return tuple(feature_map[:, :, start:min(start + step, rows)] for start in range(0, count * step, step))


def stride_one_copy(stage: nn.Module) -> nn.Module:
    """A deep copy of a ResNet stage (same weights) whose convolutions all have stride 1.

    The stride of a ResNet stage is in its first block (the 3x3 conv and the shortcut's
    1x1 conv); making it 1 keeps the input's resolution, all weights stay valid.
    """
    stage = copy.deepcopy(stage)
    for module in stage.modules():
        if isinstance(module, nn.Conv2d):
            module.stride = (1, 1)
    return stage


class MGNLosses:
    """MGN's losses: the configured losses applied per head and per feature set, named
    ``<loss name>_<branch>`` (e.g. ``loss_cls_b21``, ``loss_triplet_b33``).

    A loss reading the classifier outputs (cross entropy, focal) is computed on each of
    the eight heads with weight 1/8; a loss reading the training features (triplet,
    circle, cosface) on b1, b2 and b3 and on the concatenated stripe features of b2
    ("b22") and of b3 ("b33") with weight 1/5; both times on top of the loss's own SCALE.

    Args:
        losses: the configured losses (a LossSet or a sequence of ReidLoss).
    """

    def __init__(self, losses: Union[LossSet, Sequence[ReidLoss]]):
        self.losses = tuple(losses.losses if isinstance(losses, LossSet) else losses)

    def __call__(self, outputs: Mapping[str, HeadOutputs], targets: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Compute every loss term.

        Args:
            outputs: head name -> that head's training outputs (all eight heads).
            targets: (B,) class ids.
        Returns:
            dict of scalar, scaled loss terms.
        """
        terms: Dict[str, torch.Tensor] = {}
        # Classification terms first, then metric terms: fast-reid's order.
        for loss in self._classification_losses():
            for head in MGN_HEADS:
                for name, value in loss(outputs[head], targets).items():
                    terms[f"{name}_{head[:-len('_head')]}"] = value * _CLASSIFICATION_WEIGHT
        for loss in self._metric_losses():
            for suffix, heads in _METRIC_SETS.items():
                features = torch.cat([outputs[head]["features"] for head in heads], dim=1)
                for name, value in loss({"features": features}, targets).items():
                    terms[f"{name}_{suffix}"] = value * _METRIC_WEIGHT
        return terms

    def _classification_losses(self):
        return [loss for loss in self.losses if loss.input_key != "features"]

    def _metric_losses(self):
        return [loss for loss in self.losses if loss.input_key == "features"]

    def __repr__(self) -> str:
        return f"MGNLosses({', '.join(repr(loss) for loss in self.losses)})"


def check_mgn_config(cfg) -> None:
    """Check that the backbone is a ResNet MGN can split (no non-local blocks), then the
    backbone, head and loss values, building nothing."""
    opts = cfg.MODEL.BACKBONE
    require_backbone(cfg, _SPLITTABLE_BACKBONES, "MGN", "splits a ResNet's layer3 and layer4 into its branches")
    if opts.WITH_NL:
        raise ConfigError("MODEL.BACKBONE.WITH_NL is True, but MGN's trunk and branches have no non-local "
                          "blocks; set MODEL.BACKBONE.WITH_NL False (as Base-MGN.yml does)")
    check_parts_config(cfg)


def _split_resnet(resnet: nn.Module) -> Tuple[nn.Sequential, nn.Sequential, nn.Module]:
    """(trunk up to layer3's first block, the rest of layer3, layer4) of a ResNet."""
    trunk = nn.Sequential(resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool,
                          resnet.layer1, resnet.layer2, resnet.layer3[0])
    return trunk, nn.Sequential(*resnet.layer3[1:]), resnet.layer4


@META_ARCH_REGISTRY.register()
class MGN(ReidModelBase):
    """Multiple Granularity Network (Wang et al., ACM MM 2018) in fast-reid's layout (see the module doc).

    Eval mode returns the concatenated test features of the eight heads, in the order of
    MGN_TEST_ORDER (B, 8 x D); training mode returns MGNLosses' named terms.

    Args:
        backbone: the shared trunk (images -> map).
        b1, b2, b3: the branches (trunk map -> map); b2 and b3 must keep enough rows
            for 2 and 3 stripes.
        heads: head name -> head module, for every name of MGN_HEADS.
        pixel_mean, pixel_std: per-channel statistics of 0..255 images.
        loss_fn: (head name -> training outputs, targets) -> dict of named scaled losses
            (MGNLosses); needed for training only.
    """

    def __init__(self, *, backbone: nn.Module, b1: nn.Module, b2: nn.Module, b3: nn.Module,
                 heads: Mapping[str, nn.Module], pixel_mean: Sequence[float], pixel_std: Sequence[float],
                 loss_fn: Callable = None):
        super().__init__(pixel_mean, pixel_std)
        if set(heads) != set(MGN_HEADS):
            raise ValueError(f"MGN needs the heads {', '.join(MGN_HEADS)}, got {', '.join(heads)}")
        self.backbone = backbone
        self.b1, self.b2, self.b3 = b1, b2, b3
        for name in MGN_HEADS:  # fast-reid's registration order
            setattr(self, name, heads[name])
        self.loss_fn = loss_fn

    check_config = staticmethod(check_mgn_config)

    @classmethod
    def from_config(cls, cfg) -> "MGN":
        """Build trunk, branches, heads and losses from MODEL.* (the backbone must be a ResNet).

        The branches get their own copies of the backbone's layer3 (after its first block)
        and layer4, so ImageNet weights (MODEL.BACKBONE.PRETRAIN) reach all three.
        """
        check_mgn_config(cfg)
        resnet = build_backbone(cfg)
        trunk, rest_of_layer3, layer4 = _split_resnet(resnet)
        part_layer4 = stride_one_copy(layer4)
        branches = {"b1": nn.Sequential(copy.deepcopy(rest_of_layer3), copy.deepcopy(layer4))}
        for name in ("b2", "b3"):
            branches[name] = nn.Sequential(copy.deepcopy(rest_of_layer3), copy.deepcopy(part_layer4))
        heads = {name: build_heads(cfg, resnet.out_channels) for name in MGN_HEADS}
        return cls(backbone=trunk, **branches, heads=heads, pixel_mean=list(cfg.MODEL.PIXEL_MEAN),
                   pixel_std=list(cfg.MODEL.PIXEL_STD), loss_fn=MGNLosses(build_losses(cfg)))

    def head_inputs(self, images: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Map normalised images to each head's input: its branch's whole map or one stripe of it."""
        shared = self.backbone(images)
        maps = {name: getattr(self, name)(shared) for name in MGN_STRIPES}
        stripes = {name: horizontal_stripes(maps[name], count) for name, count in MGN_STRIPES.items()}
        return {head: maps[branch] if stripe is None else stripes[branch][stripe]
                for head, (branch, stripe) in MGN_HEADS.items()}

    def forward(self, batch: Union[Mapping[str, torch.Tensor], torch.Tensor]
                ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """Training: dict of named losses; eval: features (B, 8 x D).

        Args:
            batch: {"images": (B, 3, H, W), "targets": (B,) int64 (training), ...},
                or an image tensor (eval).
        """
        inputs = self.head_inputs(self.preprocess_image(batch))
        if not self.training:
            return torch.cat([getattr(self, head)(inputs[head]) for head in MGN_TEST_ORDER], dim=1)
        targets = self.training_targets(batch, self.loss_fn)
        outputs = {head: getattr(self, head)(inputs[head], targets) for head in MGN_HEADS}
        return self.loss_fn(outputs, targets)
