"""``build_transforms``: the one reader of the ``INPUT.*`` config keys, but for where the batched ops run
(INPUT.DEVICE_AUGMENT), which the run plan decides (``runtime.run_plan.device_augment_decision``)."""

import logging
from typing import List, Optional, Tuple, Union

import torch

from reid_engine.config import ConfigError
from reid_engine.runtime.run_plan import DEVICE_AUGMENT_CHOICES, batched_op_names, device_augment_decision, reordered_keys
from reid_engine.utils.registry import UnknownChoiceError

from .autoaugment import AugMix, AutoAugment
from .base import AugmentationPipeline, RandomApply, Transform
from .batched import BatchAugmentation, derived_seed
from .erasing import RandomErasing, RandomPatch
from .geometric import CenterCrop, RandomAffine, RandomHorizontalFlip, RandomPadCrop, RandomResizedCrop, Resize
from .photometric import ColorJitter

__all__ = ["build_transforms", "build_batch_augmentation", "device_augment_enabled", "DEVICE_AUGMENT_CHOICES"]

logger = logging.getLogger(__name__)

def _size(values, key: str):
    """Return a ``[height, width]`` config value as a tuple, or raise a one-line error."""
    if len(values) != 2:
        raise ValueError(f"{key} must be [height, width], got {list(values)}")
    return int(values[0]), int(values[1])


def _movable_ops(inp, size: Optional[Tuple[int, int]]):
    """The ops INPUT.DEVICE_AUGMENT can move to the device: ``(pad_crop, flip, erasing)``, None when off.

    ``size`` is the pad-crop's output size (None: the input size).
    """
    pad_crop = RandomPadCrop(inp.PADDING.SIZE, mode=inp.PADDING.MODE, size=size) if inp.PADDING.ENABLED else None
    flip = RandomHorizontalFlip(p=inp.FLIP.PROB) if inp.FLIP.ENABLED else None
    erasing = RandomErasing(p=inp.REA.PROB, scale=list(inp.REA.SCALE), ratio=list(inp.REA.RATIO),
                            value=list(inp.REA.VALUE)) if inp.REA.ENABLED else None
    return pad_crop, flip, erasing


def _train_ops(inp, batched: bool) -> List[Transform]:
    """The per-image training ops in the order the ReID recipes apply them; with ``batched``,
    without pad-crop, flip and random erasing (the training device applies them to the batch)."""
    ops: List[Transform] = []
    size = _size(inp.SIZE_TRAIN, "INPUT.SIZE_TRAIN")
    if inp.AUTOAUG.ENABLED:
        ops.append(RandomApply(AutoAugment(), p=inp.AUTOAUG.PROB))
    if size[0] > 0:
        ops.append(Resize(size))
    if inp.CROP.ENABLED:
        size = _size(inp.CROP.SIZE, "INPUT.CROP.SIZE")
        ops.append(RandomResizedCrop(size, scale=inp.CROP.SCALE, ratio=inp.CROP.RATIO))
    pad_crop, flip, erasing = (None, None, None) if batched else _movable_ops(inp, size if size[0] > 0 else None)
    ops += [op for op in (pad_crop, flip) if op is not None]
    if inp.CJ.ENABLED:
        ops.append(RandomApply(ColorJitter(inp.CJ.BRIGHTNESS, inp.CJ.CONTRAST,
                                           inp.CJ.SATURATION, inp.CJ.HUE), p=inp.CJ.PROB))
    if inp.AFFINE.ENABLED:
        # The usual ReID affine: +-10 degrees, scale 0.9..1.1, a slight shear, black fill.
        ops.append(RandomAffine(degrees=10, translate=None, scale=(0.9, 1.1), shear=0.1))
    if inp.AUGMIX.ENABLED:
        ops.append(RandomApply(AugMix(), p=inp.AUGMIX.PROB))
    if erasing is not None:
        ops.append(erasing)
    return ops


def device_augment_enabled(cfg, device: Union[str, torch.device, None] = None) -> bool:
    """Whether pad-crop, flip and random erasing run batched on the device (INPUT.DEVICE_AUGMENT).

    The rule is the run plan's (``runtime.run_plan.device_augment_decision``): ``auto`` turns it
    on for CUDA training unless INPUT.CJ / AFFINE / AUGMIX / RPT is enabled.

    Args:
        cfg: the config (INPUT.*, MODEL.DEVICE).
        device: the training device (default: the one MODEL.DEVICE names; "auto" means cuda when available).
    Returns:
        True when the per-image training pipeline leaves these ops to :class:`BatchAugmentation`.
    Raises:
        UnknownChoiceError: INPUT.DEVICE_AUGMENT is not auto, on or off.
    """
    return device_augment_decision(cfg, _device_type(cfg.MODEL.DEVICE if device is None else device))[0]


def _device_type(name: Union[str, torch.device]) -> str:
    """The device type a MODEL.DEVICE value names ("auto": cuda when available), without raising."""
    text = str(name).strip().lower()
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if text.startswith("cuda") else "cpu"


def build_batch_augmentation(cfg, device: Union[str, torch.device], seed: int,
                             rank: int = 0) -> Optional[BatchAugmentation]:
    """Build the batched pad-crop / flip / random erasing of ``cfg.INPUT``, or None.

    Logs one line saying where these ops run and why. The per-image pipeline that
    :func:`build_transforms` builds from the same config leaves out exactly these ops.

    Args:
        cfg: the config (INPUT.*, MODEL.DEVICE).
        device: the training device.
        seed: the training stream seed (the loader's), mixed with ``rank``.
        rank: the process rank (ranks augment their own shares differently).
    Returns:
        A :class:`BatchAugmentation`, or None when the per-image pipeline keeps these ops.
    Raises:
        ConfigError: a wrong INPUT value.
    """
    names, device = batched_op_names(cfg), torch.device(device)
    enabled, reason = device_augment_decision(cfg, device.type)
    if not enabled:
        if names:
            logger.info("Augmentation: %s per image in the loader workers (%s)", ", ".join(names), reason)
        return None
    if reordered_keys(cfg):
        logger.warning("INPUT.DEVICE_AUGMENT on: %s now run before %s instead of after them; set it to off "
                       "to keep the per-image order", ", ".join(reordered_keys(cfg)), ", ".join(names))
    try:
        pad_crop, flip, erasing = _movable_ops(cfg.INPUT, None)
    except ValueError as e:  # the ops check their own arguments; they name the INPUT key
        raise ConfigError(f"{e}: fix that INPUT value") from e
    augment = BatchAugmentation(device, derived_seed(seed, rank, 4), flip, pad_crop, erasing)
    logger.info("Augmentation: %s batched on %s before the forward pass (%s)", ", ".join(names), device, reason)
    return augment


def build_transforms(cfg, is_train: bool = True) -> AugmentationPipeline:
    """Build the training or test image pipeline from ``cfg.INPUT``.

    Training: [AutoAugment] -> resize (bicubic) -> [random resized crop] -> [pad + random crop]
    -> [flip] -> [color jitter] -> [affine] -> [AugMix] -> uint8 tensor -> [random erasing];
    random patch, when enabled, is a batch op. Test: resize -> [centre crop to CROP.SIZE].
    Training pipelines let JPEGs decode at reduced scale; test pipelines decode at full size,
    as deployed models' clients do (:func:`_decode_size`).
    With INPUT.DEVICE_AUGMENT on (:func:`device_augment_enabled`), pad + crop, flip and random
    erasing are left out: :func:`build_batch_augmentation` applies them on the training device.

    Args:
        cfg: the config (only ``cfg.INPUT`` is read).
        is_train: training pipeline (random) or test pipeline (deterministic).
    Raises:
        ConfigError: a wrong INPUT value (the op's message, naming the key).
        UnknownChoiceError: INPUT.DEVICE_AUGMENT is not auto, on or off.
    Returns:
        An :class:`AugmentationPipeline` mapping a PIL image (and an rng) to a (3, H, W)
        uint8 tensor with values 0..255.
    """
    try:
        return _build_pipeline(cfg, is_train)
    except (ConfigError, UnknownChoiceError):
        raise
    except ValueError as e:  # the ops check their own arguments; they name the INPUT key
        raise ConfigError(f"{e}: fix that INPUT value") from e


def _decode_size(resize_to: Tuple[int, int], is_train: bool) -> Optional[Tuple[int, int]]:
    """The ``(width, height)`` JPEGs may be decoded at (Pillow draft mode), or None: full size.

    The one place that decides it. Test pipelines (evaluation, reid-extract, int8 calibration and
    its check) decode at full size, because a deployed model's clients do: they get decoded
    frames or crops (arrays), to which JPEG DCT scaling cannot apply, so evaluating on
    draft-decoded pixels would measure another input than the deployed model sees. It costs
    3-4x the decode time on images at least twice the input size (a few % of an evaluation
    on the CPU; tools/benchmarks/bench_decode.py). Training keeps draft decoding: it is part
    of the augmentation, not of the deployment contract, and it is the larger decode volume.
    """
    return (resize_to[1], resize_to[0]) if is_train and resize_to[0] > 0 else None


def _build_pipeline(cfg, is_train: bool) -> AugmentationPipeline:
    """build_transforms without the error translation."""
    inp = cfg.INPUT
    batch_ops: List[Transform] = []
    if is_train:
        ops = _train_ops(inp, batched=device_augment_enabled(cfg))
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
    pipeline = AugmentationPipeline(ops, batch_ops, decode_size=_decode_size(resize_to, is_train))
    logger.debug("%s transforms: %r", "Train" if is_train else "Test", pipeline)
    return pipeline
