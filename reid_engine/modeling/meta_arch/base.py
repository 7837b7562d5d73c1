"""What every meta architecture shares: pixel statistics, input checks, the training batch."""
from typing import Mapping, Optional, Sequence, Union

import torch
from torch import nn

from reid_engine.config import ConfigError

from ..backbones.build import BACKBONE_REGISTRY
from ..heads.build import HEADS_REGISTRY
from ..losses.build import check_loss_names

__all__ = ["ReidModelBase", "check_parts_config", "require_backbone"]

Batch = Union[Mapping[str, torch.Tensor], torch.Tensor]


def check_parts_config(cfg) -> None:
    """Check the enumerated values of the backbone, head and losses a meta architecture builds."""
    BACKBONE_REGISTRY.check_config(cfg)
    HEADS_REGISTRY.check_config(cfg)
    check_loss_names(cfg)


def require_backbone(cfg, names: Sequence[str], architecture: str, reason: str) -> None:
    """Check that MODEL.BACKBONE.NAME is registered and one of `names`, which a meta
    architecture needs for `reason` (e.g. "splits a ResNet's layer3 and layer4")."""
    name = cfg.MODEL.BACKBONE.NAME
    BACKBONE_REGISTRY.get(name)  # an unknown name: the registry's "did you mean" error
    if name not in names:
        raise ConfigError(f"MODEL.BACKBONE.NAME is {name}, but {architecture} {reason}; set it to "
                          f"{' or '.join(names)} or use MODEL.META_ARCHITECTURE Baseline")


class ReidModelBase(nn.Module):
    """Base of the meta architectures: normalises 0..255 images with MODEL.PIXEL_MEAN / STD
    and reads the training targets of a batch.

    Args:
        pixel_mean, pixel_std: per-channel statistics of 0..255 images.
    """

    #: why MODEL.COMPILE auto keeps this architecture eager (None: it compiles); see runtime/compile.py
    EAGER_ONLY_REASON = None

    def __init__(self, pixel_mean: Sequence[float], pixel_std: Sequence[float]):
        super().__init__()
        if len(pixel_mean) != len(pixel_std):
            raise ConfigError(f"MODEL.PIXEL_MEAN has {len(pixel_mean)} values but MODEL.PIXEL_STD "
                              f"has {len(pixel_std)}; give one per image channel")
        if min(pixel_std) <= 0:
            raise ConfigError(f"MODEL.PIXEL_STD must be positive, got {list(pixel_std)}")
        # Not persistent: fast-reid checkpoints do not store them, the config does.
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32)
                             .view(1, -1, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32)
                             .view(1, -1, 1, 1), persistent=False)

    @property
    def device(self) -> torch.device:
        """The device of the model's buffers and parameters."""
        return self.pixel_mean.device

    def weights_channels_last(self) -> bool:
        """Whether the model's convolution weights are in the channels_last memory format (its first
        4-D parameter, unambiguously: a 1x1 kernel is both), so that images are laid out to match."""
        weight = next((p for p in self.parameters() if p.dim() == 4), None)
        return weight is not None and weight.is_contiguous(memory_format=torch.channels_last) \
            and not weight.is_contiguous()

    def preprocess_image(self, batch: Batch) -> torch.Tensor:
        """Return normalised float images on the model's device; the input is not modified.

        Args:
            batch: a batch dict with "images" (B, 3, H, W) uint8 0..255 or float, or
                that tensor itself.
        """
        images = batch["images"] if isinstance(batch, Mapping) else batch
        if isinstance(images, torch.Tensor) and images.dim() == 5:
            raise ConfigError(f"{type(self).__name__} got tracklets (B, T, C, H, W) {tuple(images.shape)}: "
                              "video datasets need MODEL.META_ARCHITECTURE VideoBaseline")
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a (B, C, H, W) tensor, got {shape}")
        if images.shape[1] != self.pixel_mean.shape[1]:
            raise ValueError(f"images have {images.shape[1]} channels but MODEL.PIXEL_MEAN has "
                             f"{self.pixel_mean.shape[1]} values")
        images = images.to(self.device, non_blocking=True)
        # sub/div are out of place: the caller's tensor stays as it was.
        images = images.to(self.pixel_mean.dtype).sub(self.pixel_mean).div(self.pixel_std)
        if self.weights_channels_last():  # build_model laid them out so (MODEL.CHANNELS_LAST)
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def run_backbone(self, backbone: nn.Module, batch: Batch,
                     images: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Normalised images through `backbone`; a backbone with ``takes_camids = True`` (e.g.
        a ViT with a camera embedding) also gets the batch's "camids" (None for a bare tensor).
        `images`: the batch already through `preprocess_image`, when several backbones share it."""
        if images is None:
            images = self.preprocess_image(batch)
        if not getattr(backbone, "takes_camids", False):
            return backbone(images)
        return backbone(images, camids=self.batch_camids(batch))

    def batch_camids(self, batch: Batch) -> Optional[torch.Tensor]:
        """The batch's (B,) "camids" on the model's device, or None (none given, or a bare tensor)."""
        camids = batch.get("camids") if isinstance(batch, Mapping) else None
        return None if camids is None else camids.to(self.device, non_blocking=True)

    def training_targets(self, batch: Batch, loss_fn) -> torch.Tensor:
        """The batch's (B,) class ids on the model's device, after checking that the model
        can be trained: a batch dict with "targets" and a loss function `loss_fn`."""
        if not isinstance(batch, Mapping) or "targets" not in batch:
            raise ValueError("training needs a batch dict with 'targets'; call model.eval() "
                             "to extract features")
        if loss_fn is None:
            raise RuntimeError(f"this {type(self).__name__} has no loss_fn; build it with from_config(cfg) "
                               "or pass loss_fn to train it")
        return batch["targets"].to(self.device, non_blocking=True)
