"""Baseline meta architecture: normalise, backbone, head, losses."""
from typing import Callable, Dict, Mapping, Sequence, Union

import torch
from torch import nn

from ..backbones.build import build_backbone
from ..heads.build import build_heads
from ..losses.build import build_losses
from .base import ReidModelBase, check_parts_config
from .build import META_ARCH_REGISTRY

__all__ = ["Baseline"]

LossFn = Callable[[Dict[str, torch.Tensor], torch.Tensor], Dict[str, torch.Tensor]]


@META_ARCH_REGISTRY.register()
class Baseline(ReidModelBase):
    """Single-branch ReID model: images -> backbone -> head.

    Args:
        backbone: maps (B, 3, H, W) images to a feature map.
        heads: maps the feature map (and targets in training) to outputs.
        pixel_mean, pixel_std: per-channel statistics of 0..255 images.
        loss_fn: (head outputs, targets) -> dict of named scaled losses; needed for
            training only.
    """

    def __init__(self, *, backbone: nn.Module, heads: nn.Module, pixel_mean: Sequence[float],
                 pixel_std: Sequence[float], loss_fn: LossFn = None):
        super().__init__(pixel_mean, pixel_std)
        self.backbone = backbone
        self.heads = heads
        self.loss_fn = loss_fn

    check_config = staticmethod(check_parts_config)

    @classmethod
    def from_config(cls, cfg) -> "Baseline":
        """Build backbone, heads (sized by the backbone's `out_channels`) and losses from the
        config; reads MODEL.PIXEL_MEAN/STD."""
        backbone = build_backbone(cfg)
        return cls(backbone=backbone, heads=build_heads(cfg, backbone.out_channels),
                   pixel_mean=list(cfg.MODEL.PIXEL_MEAN), pixel_std=list(cfg.MODEL.PIXEL_STD),
                   loss_fn=build_losses(cfg))

    def forward(self, batch: Union[Mapping[str, torch.Tensor], torch.Tensor]
                ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """Training: dict of named losses; eval: features (B, D).

        Args:
            batch: {"images": (B, 3, H, W), "targets": (B,) int64 (training), "camids":
                (B,) (backbones that take them), ...}, or an image tensor (eval).
        """
        features = self.run_backbone(self.backbone, batch)
        if not self.training:
            return self.heads(features)
        targets = self.training_targets(batch, self.loss_fn)
        return self.losses(self.heads(features, targets), targets)

    def losses(self, outputs: Dict[str, torch.Tensor], targets: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Named scaled losses of the head's training outputs (subclasses add terms here).

        Args:
            outputs: the head's training outputs ("cls_outputs", "features", ...).
            targets: (B,) class ids.
        """
        return self.loss_fn(outputs, targets)
