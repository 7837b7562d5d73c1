"""VideoBaseline: Baseline for tracklets; the backbone sees every frame, the head one pooled map per tracklet."""
from typing import Dict, Mapping, Union

import torch

from reid_engine.utils.registry import check_choice

from ..layers.temporal_pool import TEMPORAL_POOLS, TemporalPool
from .baseline import Baseline
from .build import META_ARCH_REGISTRY

__all__ = ["VideoBaseline"]

# Frames per backbone call at test time: a TEST.SAMPLE_METHOD "all" tracklet can hold
# hundreds of frames, and eval-mode layers treat frames independently, so chunks are exact.
EVAL_FRAME_CHUNK = 256


@META_ARCH_REGISTRY.register()
class VideoBaseline(Baseline):
    """Baseline that also takes (B, T, C, H, W) tracklet batches.

    Tracklets: the T frames are folded into the batch for the backbone, the (B * T)
    frame maps are pooled over T by :class:`TemporalPool` (MODEL.HEADS.TEMPORAL_POOL) and
    the head and losses see one map per tracklet (so a P x K batch of tracklets trains
    exactly like a P x K batch of images). (B, C, H, W) image batches go through
    :class:`Baseline` unchanged, so one model serves image and video sets alike.

    Args:
        temporal_pool: the pooling module (``temporal_pool``); other arguments as Baseline.
    """

    def __init__(self, *, temporal_pool: TemporalPool, **kwargs):
        super().__init__(**kwargs)
        self.temporal_pool = temporal_pool

    @staticmethod
    def check_config(cfg) -> None:
        """Baseline's checks plus MODEL.HEADS.TEMPORAL_POOL."""
        Baseline.check_config(cfg)
        check_choice(cfg.MODEL.HEADS.TEMPORAL_POOL, TEMPORAL_POOLS, "MODEL.HEADS.TEMPORAL_POOL")

    @classmethod
    def from_config(cls, cfg) -> "VideoBaseline":
        """Baseline's parts plus the temporal pooling (MODEL.HEADS.TEMPORAL_POOL)."""
        base = Baseline.from_config(cfg)
        pool = TemporalPool(cfg.MODEL.HEADS.TEMPORAL_POOL, base.backbone.out_channels)
        return cls(backbone=base.backbone, heads=base.heads, pixel_mean=list(cfg.MODEL.PIXEL_MEAN),
                   pixel_std=list(cfg.MODEL.PIXEL_STD), loss_fn=base.loss_fn, temporal_pool=pool)

    def tracklet_maps(self, images: torch.Tensor) -> torch.Tensor:
        """Pooled backbone maps (B, C, h, w) of (B, T, C, H, W) tracklets."""
        b, t = images.shape[:2]
        frames = self.preprocess_image(images.flatten(0, 1))
        maps = self.backbone(frames) if self.training else self._eval_frame_maps(frames)
        return self.temporal_pool(maps.unflatten(0, (b, t)))

    # Eager even in a compiled model: evaluation tracklets come in every length (TEST.SAMPLE_METHOD
    # all), and each length (and chunk count) would compile, and record a CUDA graph, of its own.
    # compile_model applies torch.compiler.disable to these methods (a decorator here would import
    # torch._dynamo, about 1 s, whenever the package is imported).
    EAGER_METHODS = ("_eval_frame_maps",)

    def _eval_frame_maps(self, frames: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.backbone(chunk) for chunk in frames.split(EVAL_FRAME_CHUNK)])

    def forward(self, batch: Union[Mapping[str, torch.Tensor], torch.Tensor]
                ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """Training: dict of named losses; eval: one feature (B, D) per tracklet (or image).

        Args:
            batch: {"images": (B, T, 3, H, W) or (B, 3, H, W), "targets": (B,) (training)},
                or the image tensor itself (eval).
        """
        images = batch["images"] if isinstance(batch, Mapping) else batch
        if not isinstance(images, torch.Tensor) or images.dim() != 5:
            return super().forward(batch)
        features = self.tracklet_maps(images)
        if not self.training:
            return self.heads(features)
        targets = self.training_targets(batch, self.loss_fn)
        return self.loss_fn(self.heads(features, targets), targets)
