"""Batch collation: sample dicts stacked into a batch dict, and the training pipeline's batch ops."""

from typing import Any, Dict, Sequence

import torch
from torch.utils.data import default_collate

from reid_engine.config import ConfigError

from .common import sample_rng

__all__ = ["collate_samples", "TrainCollator"]


def collate_samples(samples: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Stack sample dicts into ``{"images": uint8 (B, 3, H, W), "targets": int64 (B,),
    "camids": int64 (B,), "img_paths": list[str]}``, plus ``"domains": int64 (B,)`` when
    the samples carry a ``"domain"`` (training samples do, test samples do not).
    Tracklet samples ((T, 3, H, W) each) stack into (B, T, 3, H, W) images.

    Raises:
        ConfigError: the images of the batch differ in size (one line naming the fix).
    """
    images = [s["image"] for s in samples]
    if any(img.shape != images[0].shape for img in images):
        sizes = sorted({tuple(img.shape[1:]) for img in images})
        raise ConfigError(f"images of one batch have different sizes {sizes}; set "
                          f"INPUT.SIZE_TRAIN / INPUT.SIZE_TEST to a fixed [height, width]")
    batch = {
        # default_collate stacks into shared memory inside a worker, saving one copy.
        "images": default_collate(images),
        "targets": torch.tensor([s["target"] for s in samples], dtype=torch.int64),
        "camids": torch.tensor([s["camid"] for s in samples], dtype=torch.int64),
        "img_paths": [s["img_path"] for s in samples],
    }
    if "domain" in samples[0]:
        batch["domains"] = torch.tensor([s["domain"] for s in samples], dtype=torch.int64)
    bad = [entry for s in samples for entry in s.get("bad_images", ())]
    if bad:  # images DATALOADER.ON_BAD_IMAGE skip replaced; the loader logs and removes them
        batch["bad_images"] = bad
    return batch


class TrainCollator:
    """Collate training samples, then apply the pipeline's batch ops (e.g. random patch).

    Args:
        pipeline: the training :class:`AugmentationPipeline`.
    """

    def __init__(self, pipeline):
        self.pipeline = pipeline

    def __call__(self, samples: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
        batch = collate_samples(samples)
        if self.pipeline.batch_ops:
            rng = sample_rng(*samples[0]["stream_key"], purpose=2)
            images = batch["images"]
            # Batch ops work on (N, 3, H, W): tracklet frames are folded into N and back.
            folded = self.pipeline.apply_batch(images.flatten(0, 1) if images.dim() == 5 else images, rng)
            batch["images"] = folded.view(images.shape)
        return batch
