"""Geometric ops: resize, centre crop, flip, pad + random crop, random resized crop, affine.

Resizing uses Pillow's bicubic filter (the usual choice for ReID crops). Crops, flips and
padding work on uint8 arrays through numpy views, so they cost at most one small copy.
"""

import math
from typing import Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from .base import Transform, image_size, require_rng

__all__ = [
    "Resize", "CenterCrop", "RandomHorizontalFlip", "RandomPadCrop", "RandomResizedCrop",
    "RandomAffine",
]


def _pair(size, name: str) -> Tuple[int, int]:
    """Return ``size`` as a validated ``(height, width)`` pair of positive ints."""
    if isinstance(size, (int, np.integer)):
        size = (size, size)
    size = tuple(int(s) for s in size)
    if len(size) != 2 or min(size) <= 0:
        raise ValueError(f"{name}: size must be [height, width] with positive values, got {size}")
    return size


class Resize(Transform):
    """Resize to a fixed ``(height, width)`` with bicubic interpolation.

    Args:
        size: ``(height, width)`` of the output.
    """

    input_kind = "pil"
    deterministic = True

    def __init__(self, size: Sequence[int]):
        self.size = _pair(size, "Resize")

    def __call__(self, img: Image.Image, rng=None) -> Image.Image:
        height, width = self.size
        if img.size == (width, height):
            return img
        return img.resize((width, height), Image.BICUBIC)


class CenterCrop(Transform):
    """Crop the centre ``(height, width)`` region; a smaller image is zero-padded first.

    Args:
        size: ``(height, width)`` of the output.
    """

    input_kind = "array"
    deterministic = True

    def __init__(self, size: Sequence[int]):
        self.size = _pair(size, "CenterCrop")

    def __call__(self, img: np.ndarray, rng=None) -> np.ndarray:
        out_h, out_w = self.size
        in_h, in_w = img.shape[:2]
        if in_h < out_h or in_w < out_w:
            pad_h, pad_w = max(out_h - in_h, 0), max(out_w - in_w, 0)
            img = np.pad(img, ((pad_h // 2, pad_h - pad_h // 2),
                               (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
            in_h, in_w = img.shape[:2]
        top = int(round((in_h - out_h) / 2.0))
        left = int(round((in_w - out_w) / 2.0))
        return img[top:top + out_h, left:left + out_w]


class RandomHorizontalFlip(Transform):
    """Mirror the columns with probability ``p`` (a view: no pixel copy).

    Args:
        p: flip probability.
    """

    input_kind = "array"

    def __init__(self, p: float = 0.5):
        self.p = float(p)

    def __call__(self, img: np.ndarray, rng=None) -> np.ndarray:
        if require_rng(rng, self).random() < self.p:
            return img[:, ::-1]
        return img


_PAD_MODES = ("constant", "edge", "reflect", "symmetric")


class RandomPadCrop(Transform):
    """Pad every side by ``padding`` pixels, then crop ``size`` at a random position.

    With the default constant mode the padding is never materialised: the crop window is
    placed on the virtual padded canvas and only its overlap with the image is copied.

    Args:
        padding: pixels added on each side.
        mode: "constant" (zeros), "edge", "reflect" or "symmetric".
        size: ``(height, width)`` of the crop; ``None`` keeps the input size.
    """

    input_kind = "array"

    def __init__(self, padding: int, mode: str = "constant", size: Optional[Sequence[int]] = None):
        if int(padding) < 0:
            raise ValueError(f"RandomPadCrop: padding must be >= 0, got {padding}")
        if mode not in _PAD_MODES:
            raise ValueError(f"RandomPadCrop: unknown padding mode {mode!r}; use one of "
                             f"{', '.join(_PAD_MODES)} (INPUT.PADDING.MODE)")
        self.padding = int(padding)
        self.mode = mode
        self.size = None if size is None else _pair(size, "RandomPadCrop")

    def get_params(self, in_size: Tuple[int, int],
                   rng: np.random.Generator) -> Tuple[int, int, int, int]:
        """Return ``(top, left, height, width)`` of the crop on the padded canvas."""
        in_h, in_w = in_size
        out_h, out_w = self.size or (in_h, in_w)
        span_h, span_w = in_h + 2 * self.padding - out_h, in_w + 2 * self.padding - out_w
        if span_h < 0 or span_w < 0:
            raise ValueError(f"RandomPadCrop: crop {out_h}x{out_w} is larger than the padded "
                             f"image {in_h + 2 * self.padding}x{in_w + 2 * self.padding}")
        top = int(rng.integers(0, span_h + 1))
        left = int(rng.integers(0, span_w + 1))
        return top, left, out_h, out_w

    def __call__(self, img: np.ndarray, rng=None) -> np.ndarray:
        top, left, out_h, out_w = self.get_params(img.shape[:2], require_rng(rng, self))
        pad = self.padding
        if self.mode != "constant":
            padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)), mode=self.mode)
            return padded[top:top + out_h, left:left + out_w]
        in_h, in_w = img.shape[:2]
        src_top, src_left = top - pad, left - pad
        out = np.zeros((out_h, out_w, img.shape[2]), dtype=img.dtype)
        y0, y1 = max(src_top, 0), min(src_top + out_h, in_h)
        x0, x1 = max(src_left, 0), min(src_left + out_w, in_w)
        if y1 > y0 and x1 > x0:
            out[y0 - src_top:y1 - src_top, x0 - src_left:x1 - src_left] = img[y0:y1, x0:x1]
        return out


class RandomResizedCrop(Transform):
    """Crop a random region (area fraction and aspect ratio drawn) and resize it (bicubic).

    Args:
        size: ``(height, width)`` of the output.
        scale: range of the crop area as a fraction of the image area.
        ratio: range of the crop aspect ratio (width / height), drawn log-uniformly.
    """

    input_kind = "pil"

    def __init__(self, size: Sequence[int], scale: Sequence[float] = (0.16, 1.0),
                 ratio: Sequence[float] = (0.75, 4.0 / 3.0)):
        self.size = _pair(size, "RandomResizedCrop")
        if not (0 < scale[0] <= scale[1] <= 1):
            raise ValueError(f"RandomResizedCrop: scale must satisfy 0 < min <= max <= 1, "
                             f"got {list(scale)} (INPUT.CROP.SCALE)")
        if not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"RandomResizedCrop: ratio must satisfy 0 < min <= max, got "
                             f"{list(ratio)} (INPUT.CROP.RATIO)")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))

    def get_params(self, in_size: Tuple[int, int],
                   rng: np.random.Generator) -> Tuple[int, int, int, int]:
        """Return ``(top, left, height, width)`` of the crop in input pixels."""
        in_h, in_w = in_size
        area = in_h * in_w
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= in_w and 0 < h <= in_h:
                return int(rng.integers(0, in_h - h + 1)), int(rng.integers(0, in_w - w + 1)), h, w
        # Fallback: the largest centred crop whose aspect ratio is inside the range.
        aspect = in_w / in_h
        if aspect < self.ratio[0]:
            w, h = in_w, int(round(in_w / self.ratio[0]))
        elif aspect > self.ratio[1]:
            h, w = in_h, int(round(in_h * self.ratio[1]))
        else:
            h, w = in_h, in_w
        return (in_h - h) // 2, (in_w - w) // 2, h, w

    def __call__(self, img: Image.Image, rng=None) -> Image.Image:
        top, left, h, w = self.get_params(image_size(img), require_rng(rng, self))
        out_h, out_w = self.size
        return img.resize((out_w, out_h), Image.BICUBIC, box=(left, top, left + w, top + h))


def affine_matrix(center: Tuple[float, float], angle: float, translate: Tuple[float, float],
                  scale: float, shear: Tuple[float, float]) -> np.ndarray:
    """Return the 3x3 forward affine map (pixel coordinates, y down) about ``center``.

    Args:
        center: ``(x, y)`` the rotation / scale / shear is taken around.
        angle: rotation in degrees, counter-clockwise as seen on screen.
        translate: ``(dx, dy)`` shift in pixels applied last.
        scale: isotropic scale factor.
        shear: ``(x, y)`` shear angles in degrees.
    Returns:
        A float64 (3, 3) matrix mapping input coordinates to output coordinates.
    """
    a = math.radians(angle)
    # y points down, so a counter-clockwise turn on screen is this matrix.
    rot = np.array([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
    shr = np.array([[1.0, math.tan(math.radians(shear[0]))],
                    [math.tan(math.radians(shear[1])), 1.0]])
    linear = scale * rot @ shr
    cx, cy = center
    offset = np.array([cx + translate[0], cy + translate[1]]) - linear @ np.array([cx, cy])
    matrix = np.eye(3)
    matrix[:2, :2] = linear
    matrix[:2, 2] = offset
    return matrix


def warp_affine(img: Image.Image, matrix: np.ndarray, fill=(0, 0, 0),
                resample=Image.NEAREST) -> Image.Image:
    """Warp ``img`` by the forward 3x3 ``matrix`` keeping its size; uncovered pixels = fill."""
    inverse = np.linalg.inv(matrix)  # Pillow wants output -> input coordinates.
    return img.transform(img.size, Image.AFFINE, tuple(inverse[:2].reshape(-1)),
                         resample=resample, fillcolor=tuple(int(v) for v in fill))


class RandomAffine(Transform):
    """Random rotation, translation, scale and shear about the image centre.

    Args:
        degrees: rotation drawn uniformly in [-degrees, degrees].
        translate: ``(fx, fy)`` maximum shift as a fraction of width / height, or None.
        scale: range the scale factor is drawn from.
        shear: shear angle in degrees drawn in [-shear, shear] along x.
        fill: RGB value of uncovered pixels.
    """

    input_kind = "pil"

    def __init__(self, degrees: float = 10.0, translate: Optional[Sequence[float]] = None,
                 scale: Sequence[float] = (0.9, 1.1), shear: float = 0.1, fill=(0, 0, 0)):
        self.degrees = float(degrees)
        self.translate = None if translate is None else (float(translate[0]), float(translate[1]))
        self.scale = (float(scale[0]), float(scale[1]))
        self.shear = float(shear)
        self.fill = tuple(int(v) for v in fill)

    def get_params(self, in_size: Tuple[int, int], rng: np.random.Generator):
        """Return ``(angle, (dx, dy), scale, (shear_x, shear_y))`` with integer pixel shifts."""
        angle = rng.uniform(-self.degrees, self.degrees)
        shift = (0, 0)
        if self.translate is not None:
            in_h, in_w = in_size
            shift = (int(round(rng.uniform(-1, 1) * self.translate[0] * in_w)),
                     int(round(rng.uniform(-1, 1) * self.translate[1] * in_h)))
        scale = rng.uniform(*self.scale)
        shear = (rng.uniform(-self.shear, self.shear), 0.0)
        return angle, shift, scale, shear

    def apply(self, img: Image.Image, angle: float, shift: Tuple[int, int], scale: float,
              shear: Tuple[float, float]) -> Image.Image:
        """Warp ``img`` with the given parameters (see :func:`affine_matrix`)."""
        matrix = affine_matrix((img.width / 2.0, img.height / 2.0), angle, shift, scale, shear)
        return warp_affine(img, matrix, self.fill)

    def __call__(self, img: Image.Image, rng=None) -> Image.Image:
        params = self.get_params(image_size(img), require_rng(rng, self))
        return self.apply(img, *params)
