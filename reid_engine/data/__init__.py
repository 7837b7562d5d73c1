"""Data: datasets, augmentations, samplers and the train / test loaders.

The training sampler helpers are public for loaders built elsewhere (the label-free loader):
``build_train_sampler`` instantiates DATALOADER.SAMPLER_TRAIN, ``per_worker_batch`` splits the
global batch over the workers.
"""

from .build import (
                    DevicePrefetcher,
                    TrainLoader,
                    build_reid_inference_loader,
                    build_reid_test_loader,
                    build_reid_train_loader,
)
from .common import ImageReadError, read_image
from .datasets import DATASET_REGISTRY
from .samplers import SAMPLER_REGISTRY
from .train_sampling import build_train_sampler, per_worker_batch
from .transforms import build_batch_augmentation, build_transforms

__all__ = [
    "build_reid_train_loader", "build_reid_test_loader", "build_reid_inference_loader", "DevicePrefetcher", "TrainLoader",
    "DATASET_REGISTRY", "SAMPLER_REGISTRY", "build_transforms", "build_batch_augmentation", "read_image", "ImageReadError",
    "build_train_sampler", "per_worker_batch",
]
