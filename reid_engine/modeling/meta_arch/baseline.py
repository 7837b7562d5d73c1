"""Baseline meta architecture: normalise, backbone, head, losses."""
from typing import Callable, Dict, Mapping, Sequence, Union

import torch
from torch import nn

from reid_engine.config import ConfigError

from ..backbones.build import BACKBONE_REGISTRY, build_backbone
from ..heads.build import HEADS_REGISTRY, build_heads
from ..losses.build import build_losses, check_loss_names
from .build import META_ARCH_REGISTRY

__all__ = ["Baseline"]

LossFn = Callable[[Dict[str, torch.Tensor], torch.Tensor], Dict[str, torch.Tensor]]


@META_ARCH_REGISTRY.register()
class Baseline(nn.Module):
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
        super().__init__()
        if len(pixel_mean) != len(pixel_std):
            raise ConfigError(f"MODEL.PIXEL_MEAN has {len(pixel_mean)} values but MODEL.PIXEL_STD "
                              f"has {len(pixel_std)}; give one per image channel")
        if min(pixel_std) <= 0:
            raise ConfigError(f"MODEL.PIXEL_STD must be positive, got {list(pixel_std)}")
        self.backbone = backbone
        self.heads = heads
        self.loss_fn = loss_fn
        # Not persistent: fast-reid checkpoints do not store them, the config does.
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32)
                             .view(1, -1, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32)
                             .view(1, -1, 1, 1), persistent=False)

    @staticmethod
    def check_config(cfg) -> None:
        """Check the enumerated values of the backbone, head and losses it builds."""
        BACKBONE_REGISTRY.check_config(cfg)
        HEADS_REGISTRY.check_config(cfg)
        check_loss_names(cfg)

    @classmethod
    def from_config(cls, cfg) -> "Baseline":
        """Build backbone, heads (sized by the backbone's `out_channels`) and losses from the
        config; reads MODEL.PIXEL_MEAN/STD."""
        backbone = build_backbone(cfg)
        return cls(backbone=backbone, heads=build_heads(cfg, backbone.out_channels),
                   pixel_mean=list(cfg.MODEL.PIXEL_MEAN), pixel_std=list(cfg.MODEL.PIXEL_STD),
                   loss_fn=build_losses(cfg))

    @property
    def device(self) -> torch.device:
        """The device of the model's buffers and parameters."""
        return self.pixel_mean.device

    def preprocess_image(self, batch: Union[Mapping[str, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Return normalised float images on the model's device; the input is not modified.

        Args:
            batch: a batch dict with "images" (B, 3, H, W) uint8 0..255 or float, or
                that tensor itself.
        """
        images = batch["images"] if isinstance(batch, Mapping) else batch
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a (B, C, H, W) tensor, got {shape}")
        if images.shape[1] != self.pixel_mean.shape[1]:
            raise ValueError(f"images have {images.shape[1]} channels but MODEL.PIXEL_MEAN has "
                             f"{self.pixel_mean.shape[1]} values")
        images = images.to(self.device, non_blocking=True)
        # sub/div are out of place: the caller's tensor stays as it was.
        images = images.to(self.pixel_mean.dtype).sub(self.pixel_mean).div(self.pixel_std)
        if getattr(self, "channels_last", False):  # set by build_model (MODEL.CHANNELS_LAST)
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def forward(self, batch: Union[Mapping[str, torch.Tensor], torch.Tensor]
                ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """Training: dict of named losses; eval: features (B, D).

        Args:
            batch: {"images": (B, 3, H, W), "targets": (B,) int64 (training), ...},
                or an image tensor (eval).
        """
        features = self.backbone(self.preprocess_image(batch))
        if not self.training:
            return self.heads(features)
        if not isinstance(batch, Mapping) or "targets" not in batch:
            raise ValueError("training needs a batch dict with 'targets'; call model.eval() "
                             "to extract features")
        if self.loss_fn is None:
            raise RuntimeError("this Baseline has no loss_fn; build it with from_config(cfg) "
                               "or pass loss_fn to train it")
        targets = batch["targets"].to(self.device, non_blocking=True)
        outputs = self.heads(features, targets)
        return self.loss_fn(outputs, targets)
