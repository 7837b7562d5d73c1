"""Occlusion ops: random erasing (per image) and random patch (across the images of a batch)."""

import math
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .base import Transform, require_rng

__all__ = ["RandomErasing", "RandomPatch", "sample_rectangle"]


def sample_rectangle(height: int, width: int, area_range: Tuple[float, float],
                     ratio_range: Tuple[float, float], rng: np.random.Generator,
                     attempts: int = 100) -> Optional[Tuple[int, int]]:
    """Draw a rectangle size whose area fraction lies in ``area_range`` and that fits the image.

    The aspect ratio (h / w) is drawn log-uniformly in ``ratio_range``.

    Args:
        height, width: image size.
        area_range: ``(min, max)`` fraction of the image area.
        ratio_range: ``(min, max)`` aspect ratio, e.g. ``(0.3, 3.3)``.
        rng: the generator.
        attempts: draws before giving up.
    Returns:
        ``(h, w)`` in pixels, or ``None`` when no draw fitted.
    """
    area = height * width
    log_ratio = (math.log(ratio_range[0]), math.log(ratio_range[1]))
    for _ in range(attempts):
        target = area * rng.uniform(*area_range)
        aspect = math.exp(rng.uniform(*log_ratio))
        h = int(round(math.sqrt(target * aspect)))
        w = int(round(math.sqrt(target / aspect)))
        # Rounding can push the area just outside the range: such draws are rejected too.
        if 0 < h < height and 0 < w < width and \
                area_range[0] <= h * w / area <= area_range[1]:
            return h, w
    return None


class RandomErasing(Transform):
    """Random erasing (Zhong et al., 2020): fill one random rectangle with a constant color.

    Works in place on the (3, H, W) uint8 tensor it is given (the pipeline's own buffer) and
    returns it. The defaults are fast-reid's (torchvision's RandomErasing): an area of 2% to
    33% of the image and an aspect ratio drawn log-uniformly from 0.3 to 3.3.

    Args:
        p: probability of erasing.
        scale: range of the rectangle's area as a fraction of the image (INPUT.REA.SCALE).
        ratio: ``(min, max)`` aspect ratio (h / w) (INPUT.REA.RATIO).
        value: fill color per channel on the 0..255 scale (a number or 3 numbers).
    """

    input_kind = "tensor"

    def __init__(self, p: float = 0.5, scale: Sequence[float] = (0.02, 0.33),
                 ratio: Sequence[float] = (0.3, 3.3),
                 value: Union[float, Sequence[float]] = (123.675, 116.28, 103.53)):
        if not 0 <= p <= 1:
            raise ValueError(f"RandomErasing: probability {p} is outside [0, 1] (INPUT.REA.PROB)")
        if len(scale) != 2 or not 0 < scale[0] <= scale[1] < 1:
            raise ValueError(f"RandomErasing: scale must be [min, max] with 0 < min <= max < 1, got "
                             f"{list(scale)} (INPUT.REA.SCALE)")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"RandomErasing: ratio must be [min, max] with 0 < min <= max, got "
                             f"{list(ratio)} (INPUT.REA.RATIO)")
        values = [float(value)] * 3 if np.isscalar(value) else [float(v) for v in value]
        if len(values) not in (1, 3) or not all(0 <= v <= 255 for v in values):
            raise ValueError(f"RandomErasing: value must be 1 or 3 numbers in 0..255, got "
                             f"{value} (INPUT.REA.VALUE)")
        self.p = float(p)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.value = values * 3 if len(values) == 1 else values
        self._fill = np.array([int(round(v)) for v in self.value], dtype=np.uint8).reshape(3, 1, 1)

    def get_params(self, height: int, width: int,
                   rng: np.random.Generator) -> Optional[Tuple[int, int, int, int]]:
        """Return ``(top, left, h, w)`` of the rectangle to erase, or ``None`` for no erasing."""
        if rng.random() >= self.p:
            return None
        size = sample_rectangle(height, width, self.scale, self.ratio, rng)
        if size is None:
            return None
        h, w = size
        return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w

    def __call__(self, img: torch.Tensor, rng=None) -> torch.Tensor:
        params = self.get_params(img.shape[1], img.shape[2], require_rng(rng, self))
        if params is not None:
            top, left, h, w = params
            # Written through a numpy view of the tensor: a small strided fill is several times
            # cheaper in numpy than through torch's indexing machinery.
            img.numpy()[:, top:top + h, left:left + w] = self._fill
        return img


class RandomPatch(Transform):
    """Random patch (Zhou et al., 2019): paste a patch cut from another image of the batch.

    The pool the patches come from is the batch itself, so the result depends only on the
    batch and the generator, never on which loader worker built it. Each image is covered,
    with probability ``p``, by a patch of another image (area fraction in ``area``,
    aspect ratio in ``[min_ratio, 1 / min_ratio]``, mirrored with ``flip_prob``) at a random
    place. Patches are cut from the batch as it was before any pasting.

    Args:
        p: probability that an image receives a patch.
        area: range of the patch area as a fraction of the image.
        min_ratio: smallest aspect ratio.
        flip_prob: probability of mirroring the patch.
    """

    input_kind = "tensor"

    def __init__(self, p: float = 0.5, area: Sequence[float] = (0.01, 0.5), min_ratio: float = 0.1,
                 flip_prob: float = 0.5):
        if not 0 <= p <= 1:
            raise ValueError(f"RandomPatch: probability {p} is outside [0, 1] (INPUT.RPT.PROB)")
        self.p = float(p)
        self.area = (float(area[0]), float(area[1]))
        self.min_ratio = float(min_ratio)
        self.flip_prob = float(flip_prob)

    def __call__(self, images: torch.Tensor, rng=None) -> torch.Tensor:
        """Return a new (B, 3, H, W) batch with patches pasted (the input is not modified)."""
        rng = require_rng(rng, self)
        batch, _, height, width = images.shape
        out = images.clone()
        if batch < 2:  # no other image to take a patch from
            return out
        for dst in range(batch):
            if rng.random() >= self.p:
                continue
            size = sample_rectangle(height, width, self.area, (self.min_ratio, 1.0 / self.min_ratio), rng)
            if size is None:
                continue
            h, w = size
            src = int(rng.integers(batch - 1))
            src += src >= dst  # any image but the destination
            sy, sx = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            dy, dx = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            patch = images[src, :, sy:sy + h, sx:sx + w]
            if rng.random() < self.flip_prob:
                patch = patch.flip(-1)
            out[dst, :, dy:dy + h, dx:dx + w] = patch
        return out
