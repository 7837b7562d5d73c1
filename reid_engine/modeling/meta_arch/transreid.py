"""TransReID: a ViT with TransReID's jigsaw patch module (JPM).

The ViT (`backbone`, MODEL.BACKBONE.NAME build_vit_backbone, with its overlapping patches and
camera embedding) runs all its blocks but the last. Its last block and final norm then make
the global feature from the whole token sequence, as in a plain ViT; `local_branch`, a copy
of that block and norm (made after ImageNet weights are loaded, so it starts from them),
makes MODEL.JPM.NUM_PARTS local features. For those the patch tokens are rearranged (shifted
by SHIFT_NUM - 1 positions and shuffled across SHUFFLE_GROUPS interleaved groups: each part
then sees patches from all over the image), cut into NUM_PARTS equal groups, and each group
goes through `local_branch` behind the class token, whose output is the part's feature.

Every feature has its own head (`heads.0` global, `heads.1`.. the parts). Losses, as in
TransReID: each loss is half its value on the global head plus half its mean over the parts.
Test feature: the global head's feature and each part's divided by NUM_PARTS, concatenated.
"""
from typing import Callable, Dict, List, Mapping, Sequence, Union

import torch
from torch import nn

from reid_engine.config import ConfigError

from ..backbones.build import build_backbone
from ..backbones.vit import PATCH_SIZE, LastBlockCopy, patch_grid
from ..heads.build import build_heads
from ..losses.build import LossSet, ReidLoss, build_losses
from .base import ReidModelBase, check_parts_config, require_backbone
from .build import META_ARCH_REGISTRY

__all__ = ["TransReID", "JPMLosses", "jigsaw_rearrange", "check_jpm_config"]

_VIT_BACKBONES = ("build_vit_backbone",)


def jigsaw_rearrange(patches: torch.Tensor, shift: int, groups: int) -> torch.Tensor:
    """TransReID's shift and patch shuffle of the patch tokens (no class token).

    The sequence is rolled left by ``shift - 1`` (TransReID's offset), then read as `groups`
    consecutive runs and interleaved: token j of run g goes to position j * groups + g. When
    the length is not a multiple of `groups`, the second-to-last token is repeated at the end
    (as TransReID pads), so the result may be one token longer.

    Args:
        patches: (B, N, C) patch tokens.
        shift: SHIFT_NUM (>= 1; 1 = no shift).
        groups: SHUFFLE_GROUPS (>= 1; 1 = no shuffle).

    Returns:
        (B, N', C) rearranged tokens, N' = N rounded up to a multiple of `groups` (by at most 1).
    """
    rolled = torch.roll(patches, shifts=-(shift - 1), dims=1)
    batch, length, dim = rolled.shape
    _check_token_count(length, 1, groups, ValueError)
    if length % groups:
        # TransReID's fallback pads one token (enough for its 2 groups).
        rolled = torch.cat([rolled, rolled[:, -2:-1]], dim=1)
        length += 1
    return rolled.view(batch, groups, length // groups, dim).transpose(1, 2).reshape(batch, length, dim)


class JPMLosses:
    """TransReID's loss: every configured loss on the global head's outputs (weight 1/2) and
    averaged over the part heads (weight 1/2), on top of the loss's own SCALE. Terms are named
    ``<loss>`` (global) and ``<loss>_parts``.

    Args:
        losses: the configured losses (a LossSet or a sequence of ReidLoss).
    """

    def __init__(self, losses: Union[LossSet, Sequence[ReidLoss]]):
        self.losses = tuple(losses.losses if isinstance(losses, LossSet) else losses)

    def __call__(self, outputs: Sequence[Mapping[str, torch.Tensor]], targets: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Compute the terms.

        Args:
            outputs: the training outputs of the global head, then of each part head.
            targets: (B,) class ids.
        Returns:
            dict of scalar, scaled loss terms.
        """
        terms: Dict[str, torch.Tensor] = {}
        parts = outputs[1:]
        for loss in self.losses:
            for name, value in loss(outputs[0], targets).items():
                terms[name] = 0.5 * value
            per_part = [loss(part, targets) for part in parts]
            for name in per_part[0]:
                terms[f"{name}_parts"] = 0.5 * sum(p[name] for p in per_part) / len(parts)
        return terms

    def __repr__(self) -> str:
        return f"JPMLosses({', '.join(repr(loss) for loss in self.losses)})"


def _check_token_count(num_patches: int, num_parts: int, groups: int, error: type = ConfigError,
                       where: str = "") -> None:
    """Raise `error` unless `num_patches` patch tokens make `num_parts` parts and can be shuffled
    into `groups` runs (a multiple of `groups`, or one short of it: TransReID pads one token)."""
    if num_patches < num_parts:
        raise error(f"{num_patches} patch tokens{where} cannot make {num_parts} parts (MODEL.JPM.NUM_PARTS); "
                    "use a larger input or a smaller MODEL.BACKBONE.STRIDE_SIZE")
    if num_patches % groups and (num_patches + 1) % groups:
        raise error(f"{num_patches} patch tokens{where} cannot be shuffled into {groups} groups "
                    "(MODEL.JPM.SHUFFLE_GROUPS); use a count that divides them (TransReID: 2)")


def check_jpm_config(cfg) -> None:
    """Check that the backbone is a ViT and the MODEL.JPM values, then the parts' values."""
    require_backbone(cfg, _VIT_BACKBONES, "TransReID", "copies a ViT's last block for the jigsaw patch module")
    jpm = cfg.MODEL.JPM
    for key, low in (("NUM_PARTS", 1), ("SHIFT_NUM", 1), ("SHUFFLE_GROUPS", 1)):
        value = getattr(jpm, key)
        if not isinstance(value, int) or value < low:
            raise ConfigError(f"MODEL.JPM.{key} must be an int >= {low}, got {value!r} (TransReID: NUM_PARTS 4, "
                              "SHIFT_NUM 5, SHUFFLE_GROUPS 2)")
    stride = tuple(cfg.MODEL.BACKBONE.STRIDE_SIZE)
    if len(stride) == 2 and all(isinstance(v, int) and v > 0 for v in stride):  # else the ViT's check names it
        for key in ("SIZE_TRAIN", "SIZE_TEST"):
            size = tuple(getattr(cfg.INPUT, key))
            if len(size) == 2 and min(size) >= PATCH_SIZE:
                grid = patch_grid(size, stride)
                _check_token_count(grid[0] * grid[1], jpm.NUM_PARTS, jpm.SHUFFLE_GROUPS if jpm.REARRANGE else 1,
                                   where=f" (INPUT.{key} {list(size)})")
    if cfg.MODEL.HEADS.POOL_LAYER != "Identity":
        raise ConfigError(f"MODEL.HEADS.POOL_LAYER is {cfg.MODEL.HEADS.POOL_LAYER}, but TransReID's heads take "
                          "class tokens; set it to Identity")
    check_parts_config(cfg)


@META_ARCH_REGISTRY.register()
class TransReID(ReidModelBase):
    """A ViT with the jigsaw patch module (module docstring).

    Args:
        backbone: a VisionTransformer (``forward_tokens``, ``blocks``, ``norm``).
        local_branch: a LastBlockCopy of the backbone (its last block and norm).
        heads: 1 + num_parts heads: global first, then one per part.
        num_parts, shift, groups, rearrange: MODEL.JPM.NUM_PARTS / SHIFT_NUM / SHUFFLE_GROUPS /
            REARRANGE.
        pixel_mean, pixel_std: per-channel statistics of 0..255 images.
        loss_fn: (list of head outputs, targets) -> dict of named scaled losses (JPMLosses);
            needed for training only.
    """

    def __init__(self, *, backbone: nn.Module, local_branch: nn.Module, heads: Sequence[nn.Module], num_parts: int,
                 shift: int, groups: int, rearrange: bool, pixel_mean: Sequence[float], pixel_std: Sequence[float],
                 loss_fn: Callable = None):
        super().__init__(pixel_mean, pixel_std)
        if len(heads) != 1 + num_parts:
            raise ValueError(f"TransReID needs 1 + {num_parts} heads, got {len(heads)}")
        self.backbone = backbone
        self.local_branch = local_branch
        self.heads = nn.ModuleList(heads)
        self.num_parts, self.shift, self.groups, self.rearrange = num_parts, shift, groups, rearrange
        self.loss_fn = loss_fn

    check_config = staticmethod(check_jpm_config)

    @classmethod
    def from_config(cls, cfg) -> "TransReID":
        """Build the ViT (with its ImageNet weights), the local branch, the heads and the losses."""
        check_jpm_config(cfg)
        vit = build_backbone(cfg)
        local_branch = LastBlockCopy(vit)
        jpm = cfg.MODEL.JPM
        heads = [build_heads(cfg, vit.out_channels) for _ in range(1 + jpm.NUM_PARTS)]
        return cls(backbone=vit, local_branch=local_branch, heads=heads, num_parts=jpm.NUM_PARTS,
                   shift=jpm.SHIFT_NUM, groups=jpm.SHUFFLE_GROUPS, rearrange=jpm.REARRANGE,
                   pixel_mean=list(cfg.MODEL.PIXEL_MEAN), pixel_std=list(cfg.MODEL.PIXEL_STD),
                   loss_fn=JPMLosses(build_losses(cfg)))

    def head_inputs(self, batch: Union[Mapping[str, torch.Tensor], torch.Tensor]) -> List[torch.Tensor]:
        """The global feature map, then each part's, each (B, C, 1, 1)."""
        images = self.preprocess_image(batch)
        tokens = self.backbone.forward_tokens(images, self.batch_camids(batch), skip_last=1)
        global_map = self.backbone.last_block_feature(tokens)
        cls_token, patches = tokens[:, :1], tokens[:, 1:]
        _check_token_count(patches.shape[1], self.num_parts, 1, ValueError)  # jigsaw_rearrange checks the groups
        part_length = patches.shape[1] // self.num_parts  # TransReID drops the remainder
        if self.rearrange:
            patches = jigsaw_rearrange(patches, self.shift, self.groups)
        parts = [patches[:, i * part_length:(i + 1) * part_length] for i in range(self.num_parts)]
        return [global_map] + [self.local_branch(torch.cat([cls_token, part], dim=1)) for part in parts]

    def forward(self, batch: Union[Mapping[str, torch.Tensor], torch.Tensor]
                ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """Training: dict of named losses; eval: features (B, (1 + NUM_PARTS) x D).

        Args:
            batch: {"images": (B, 3, H, W), "targets": (B,) int64 (training), "camids": (B,)
                (with a camera embedding)}, or an image tensor (eval, no camera embedding).
        """
        inputs = self.head_inputs(batch)
        if not self.training:
            features = [head(x) for head, x in zip(self.heads, inputs)]
            return torch.cat([features[0]] + [f / self.num_parts for f in features[1:]], dim=1)
        targets = self.training_targets(batch, self.loss_fn)
        return self.loss_fn([head(x, targets) for head, x in zip(self.heads, inputs)], targets)
