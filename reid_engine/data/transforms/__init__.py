"""Image augmentations for ReID (Pillow / numpy / torch; no torchvision).

Every op is ``op(img, rng) -> img`` with an explicit ``numpy.random.Generator``; the
pipelines from :func:`build_transforms` output (3, H, W) uint8 tensors with values 0..255
(the model normalises them). Pad-crop, flip and random erasing can instead run batched on the
training device (:class:`BatchAugmentation`, INPUT.DEVICE_AUGMENT).
"""

from .autoaugment import AUGMIX_OPS, IMAGENET_POLICY, AugMix, AutoAugment, apply_op
from .base import AugmentationPipeline, RandomApply, Transform, image_size, to_array, to_pil, to_tensor
from .batched import BatchAugmentation
from .build import DEVICE_AUGMENT_CHOICES, build_batch_augmentation, build_transforms, device_augment_enabled
from .erasing import RandomErasing, RandomPatch, sample_rectangle
from .geometric import (
                   CenterCrop,
                   RandomAffine,
                   RandomHorizontalFlip,
                   RandomPadCrop,
                   RandomResizedCrop,
                   Resize,
                   affine_matrix,
                   warp_affine,
)
from .photometric import ColorJitter, shift_hue

__all__ = [
    "AUGMIX_OPS", "IMAGENET_POLICY", "AugMix", "AugmentationPipeline", "AutoAugment", "BatchAugmentation",
    "DEVICE_AUGMENT_CHOICES", "build_batch_augmentation", "device_augment_enabled",
    "CenterCrop", "ColorJitter", "RandomAffine", "RandomApply", "RandomErasing",
    "RandomHorizontalFlip", "RandomPadCrop", "RandomPatch", "RandomResizedCrop", "Resize",
    "Transform", "affine_matrix", "apply_op", "build_transforms", "image_size",
    "sample_rectangle", "shift_hue", "to_array", "to_pil", "to_tensor", "warp_affine",
]
