"""Parameter count and FLOPs of a model, logged when it is built."""
import logging
import warnings
from typing import Optional, Sequence

import torch
from torch import nn

__all__ = ["count_parameters", "count_flops", "log_model_summary"]

logger = logging.getLogger(__name__)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Return the number of parameter elements (optionally only trainable ones)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def count_flops(model: nn.Module, image_size: Sequence[int]) -> int:
    """Count FLOPs (fvcore's convention: one multiply-add = one flop) of one image's
    inference (the model's eval forward on an image tensor), on the model's device
    (build_model counts on the CPU, before moving the model to the training device).

    Args:
        model: a meta architecture: its eval forward maps a batch dict ("images" (B, 3, H, W),
            "camids" (B,)) to features.
        image_size: (height, width).

    Returns:
        total flops for one image.
    """
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    try:
        image = torch.zeros(1, 3, int(image_size[0]), int(image_size[1]), device=device)
        # a batch dict: a backbone with a camera embedding also needs camera ids
        batch = {"images": image, "camids": torch.zeros(1, dtype=torch.long, device=device)}
        # fvcore traces with torch.jit, which warns about its own deprecation.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fvcore.nn import FlopCountAnalysis  # only needed here; its import warns too

            analysis = FlopCountAnalysis(model, (batch,))
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            analysis.tracer_warnings("none")
            return int(analysis.total())
    finally:
        model.train(was_training)


def log_model_summary(model: nn.Module, image_size: Sequence[int]) -> Optional[int]:
    """Log the parameter counts and the FLOPs for one image of `image_size`.

    FLOP counting never fails the caller: an error is logged as a warning.

    Returns:
        the FLOPs, or None when they could not be counted.
    """
    total, trainable = count_parameters(model), count_parameters(model, trainable_only=True)
    logger.info("Model parameters: %.2fM (%.2fM trainable)", total / 1e6, trainable / 1e6)
    try:
        flops = count_flops(model, image_size)
    except Exception as exc:  # diagnostics only; the model itself is fine
        logger.warning("FLOPs not counted (%s: %s)", type(exc).__name__,
                       str(exc).strip().splitlines()[0] if str(exc).strip() else "")
        return None
    logger.info("Model FLOPs at %dx%d: %.3fG (multiply-adds, one image, inference)",
                int(image_size[0]), int(image_size[1]), flops / 1e9)
    return flops
