"""``build_transforms``: the one reader of the ``INPUT.*`` config keys."""

import logging
from typing import List

from reid_engine.config import ConfigError

from .autoaugment import AugMix, AutoAugment
from .base import AugmentationPipeline, RandomApply, Transform
from .erasing import RandomErasing, RandomPatch
from .geometric import CenterCrop, RandomAffine, RandomHorizontalFlip, RandomPadCrop, RandomResizedCrop, Resize
from .photometric import ColorJitter

__all__ = ["build_transforms"]

logger = logging.getLogger(__name__)


def _size(values, key: str):
    """Return a ``[height, width]`` config value as a tuple, or raise a one-line error."""
    if len(values) != 2:
        raise ValueError(f"{key} must be [height, width], got {list(values)}")
    return int(values[0]), int(values[1])


def _train_ops(inp) -> List[Transform]:
    """The per-image training ops in the order the ReID recipes apply them."""
    ops: List[Transform] = []
    size = _size(inp.SIZE_TRAIN, "INPUT.SIZE_TRAIN")
    if inp.AUTOAUG.ENABLED:
        ops.append(RandomApply(AutoAugment(), p=inp.AUTOAUG.PROB))
    if size[0] > 0:
        ops.append(Resize(size))
    if inp.CROP.ENABLED:
        size = _size(inp.CROP.SIZE, "INPUT.CROP.SIZE")
        ops.append(RandomResizedCrop(size, scale=inp.CROP.SCALE, ratio=inp.CROP.RATIO))
    if inp.PADDING.ENABLED:
        ops.append(RandomPadCrop(inp.PADDING.SIZE, mode=inp.PADDING.MODE,
                                 size=size if size[0] > 0 else None))
    if inp.FLIP.ENABLED:
        ops.append(RandomHorizontalFlip(p=inp.FLIP.PROB))
    if inp.CJ.ENABLED:
        ops.append(RandomApply(ColorJitter(inp.CJ.BRIGHTNESS, inp.CJ.CONTRAST,
                                           inp.CJ.SATURATION, inp.CJ.HUE), p=inp.CJ.PROB))
    if inp.AFFINE.ENABLED:
        # The usual ReID affine: +-10 degrees, scale 0.9..1.1, a slight shear, black fill.
        ops.append(RandomAffine(degrees=10, translate=None, scale=(0.9, 1.1), shear=0.1))
    if inp.AUGMIX.ENABLED:
        ops.append(RandomApply(AugMix(), p=inp.AUGMIX.PROB))
    if inp.REA.ENABLED:
        ops.append(RandomErasing(p=inp.REA.PROB, scale=list(inp.REA.SCALE), ratio=list(inp.REA.RATIO),
                                 value=list(inp.REA.VALUE)))
    return ops


def build_transforms(cfg, is_train: bool = True) -> AugmentationPipeline:
    """Build the training or test image pipeline from ``cfg.INPUT``.

    Training: [AutoAugment] -> resize (bicubic) -> [random resized crop] -> [pad + random crop]
    -> [flip] -> [color jitter] -> [affine] -> [AugMix] -> uint8 tensor -> [random erasing];
    random patch, when enabled, is a batch op. Test: resize -> [centre crop to CROP.SIZE].

    Args:
        cfg: the config (only ``cfg.INPUT`` is read).
        is_train: training pipeline (random) or test pipeline (deterministic).
    Raises:
        ConfigError: a wrong INPUT value (the op's message, naming the key).
    Returns:
        An :class:`AugmentationPipeline` mapping a PIL image (and an rng) to a (3, H, W)
        uint8 tensor with values 0..255.
    """
    try:
        return _build_pipeline(cfg, is_train)
    except ConfigError:
        raise
    except ValueError as e:  # the ops check their own arguments; they name the INPUT key
        raise ConfigError(f"{e}: fix that INPUT value") from e


def _build_pipeline(cfg, is_train: bool) -> AugmentationPipeline:
    """build_transforms without the error translation."""
    inp = cfg.INPUT
    batch_ops: List[Transform] = []
    if is_train:
        ops = _train_ops(inp)
        if inp.RPT.ENABLED:
            batch_ops.append(RandomPatch(p=inp.RPT.PROB))
        resize_to = _size(inp.SIZE_TRAIN, "INPUT.SIZE_TRAIN")
    else:
        resize_to = _size(inp.SIZE_TEST, "INPUT.SIZE_TEST")
        if resize_to[0] <= 0:
            raise ValueError(f"INPUT.SIZE_TEST must be positive [height, width], got "
                             f"{list(resize_to)}")
        ops = [Resize(resize_to)]
        if inp.CROP.ENABLED:
            ops.append(CenterCrop(_size(inp.CROP.SIZE, "INPUT.CROP.SIZE")))
    decode_size = (resize_to[1], resize_to[0]) if resize_to[0] > 0 else None
    pipeline = AugmentationPipeline(ops, batch_ops, decode_size=decode_size)
    logger.debug("%s transforms: %r", "Train" if is_train else "Test", pipeline)
    return pipeline
