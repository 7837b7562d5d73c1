"""Images in any accepted form (path, Pillow image, RGB array) as RGB Pillow images."""
import os
from typing import Any

import numpy as np
from PIL import Image

from ..data import read_image
from ..utils.errors import UsageError

__all__ = ["InvalidImageArrayError", "as_pil_image"]


class InvalidImageArrayError(UsageError):
    """An image array of the wrong shape or dtype."""


def as_pil_image(image: Any) -> Image.Image:
    """Turn one input image into an RGB Pillow image.

    Files are decoded at full size (never JPEG draft mode), as every client of a deployed
    model decodes them, so a path, the same image as a Pillow image and as an array all
    give the same pixels.

    Args:
        image: a file path (str or os.PathLike), a Pillow image (any mode), or an
            (H, W, 3) uint8 numpy array in RGB order.
    Returns:
        an RGB ``PIL.Image.Image``.
    Raises:
        reid_engine.data.ImageReadError: an unreadable file (the message names it).
        InvalidImageArrayError: an array of the wrong shape or dtype (a ValueError).
        TypeError: another type.
    """
    if isinstance(image, (str, os.PathLike)):
        return read_image(os.fspath(image))
    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else image.convert("RGB")
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] != 3:
            raise InvalidImageArrayError(f"image arrays must have shape (H, W, 3) in RGB order, got {image.shape}; "
                                         "convert grey images with np.stack([a] * 3, axis=-1)")
        if image.dtype != np.uint8:
            raise InvalidImageArrayError(f"image arrays must be uint8 (0..255), got {image.dtype}; "
                                         "use (a * 255).round().astype(np.uint8) for 0..1 floats")
        return Image.fromarray(np.ascontiguousarray(image), mode="RGB")
    raise TypeError(f"unsupported image type {type(image).__name__}: pass a file path, a PIL image "
                    "or an (H, W, 3) uint8 RGB numpy array")
