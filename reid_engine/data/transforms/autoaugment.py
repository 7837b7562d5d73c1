"""Policy augmentations built from Pillow image ops: AutoAugment (ImageNet policy) and AugMix.

Each op takes a strength ``level`` in [0, 1] (a fraction of its maximum magnitude) and, for
signed ops, a direction drawn at random. Maximum magnitudes follow the AutoAugment paper:
rotate 30 degrees, shear 0.3, translate 0.45 of the side, enhance factors 1 +- 0.9,
posterize down to 4 bits, solarize threshold down to 0.
"""

from typing import Callable, Dict, Sequence, Tuple

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from .base import Transform, require_rng

__all__ = ["AutoAugment", "AugMix", "apply_op", "IMAGENET_POLICY", "AUGMIX_OPS"]

# Grey fill for pixels uncovered by geometric ops: the ImageNet mean, so it reads as neutral.
_FILL = (124, 116, 104)


def _affine(img: Image.Image, coeffs: Tuple[float, ...]) -> Image.Image:
    return img.transform(img.size, Image.AFFINE, coeffs, resample=Image.BILINEAR, fillcolor=_FILL)


def _rotate(img, level, sign):
    return img.rotate(sign * 30.0 * level, resample=Image.BILINEAR, fillcolor=_FILL)


def _shear_x(img, level, sign):
    return _affine(img, (1, sign * 0.3 * level, 0, 0, 1, 0))


def _shear_y(img, level, sign):
    return _affine(img, (1, 0, 0, sign * 0.3 * level, 1, 0))


def _translate_x(img, level, sign):
    return _affine(img, (1, 0, sign * 0.45 * level * img.width, 0, 1, 0))


def _translate_y(img, level, sign):
    return _affine(img, (1, 0, 0, 0, 1, sign * 0.45 * level * img.height))


def _enhancer(cls):
    def op(img, level, sign):
        return cls(img).enhance(1.0 + sign * 0.9 * level)
    return op


def _posterize(img, level, sign):
    return ImageOps.posterize(img, 8 - int(round(4 * level)))


def _solarize(img, level, sign):
    return ImageOps.solarize(img, int(round(256 * (1.0 - level))))


def _auto_contrast(img, level, sign):
    return ImageOps.autocontrast(img)


def _equalize(img, level, sign):
    return ImageOps.equalize(img)


def _invert(img, level, sign):
    return ImageOps.invert(img)


# name -> (function(img, level, sign), whether the op has a direction)
_OPS: Dict[str, Tuple[Callable, bool]] = {
    "Rotate": (_rotate, True),
    "ShearX": (_shear_x, True),
    "ShearY": (_shear_y, True),
    "TranslateX": (_translate_x, True),
    "TranslateY": (_translate_y, True),
    "Color": (_enhancer(ImageEnhance.Color), True),
    "Contrast": (_enhancer(ImageEnhance.Contrast), True),
    "Brightness": (_enhancer(ImageEnhance.Brightness), True),
    "Sharpness": (_enhancer(ImageEnhance.Sharpness), True),
    "Posterize": (_posterize, False),
    "Solarize": (_solarize, False),
    "AutoContrast": (_auto_contrast, False),
    "Equalize": (_equalize, False),
    "Invert": (_invert, False),
}


def apply_op(img: Image.Image, name: str, level: float, rng: np.random.Generator) -> Image.Image:
    """Apply the named op at strength ``level`` in [0, 1]; signed ops draw their direction.

    Args:
        img: an RGB PIL image.
        name: a key of the op table (e.g. "Rotate", "Equalize").
        level: fraction of the op's maximum magnitude.
        rng: the generator the direction is drawn from.
    Returns:
        The transformed PIL image.
    """
    fn, signed = _OPS[name]
    sign = (1.0 if rng.random() < 0.5 else -1.0) if signed else 1.0
    return fn(img, level, sign)


# The ImageNet policy of AutoAugment (Cubuk et al., 2019): 25 sub-policies of two
# (op, probability, magnitude 0..10) steps.
IMAGENET_POLICY: Tuple[Tuple[Tuple[str, float, int], ...], ...] = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 0)),
    (("Equalize", 0.8, 0), ("Equalize", 0.6, 0)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, 0), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, 0), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 0)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, 0)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, 0), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, 0)),
    (("Equalize", 0.0, 0), ("Equalize", 0.8, 0)),
    (("Invert", 0.6, 0), ("Equalize", 1.0, 0)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, 0)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 0)),
    (("Color", 0.4, 0), ("Equalize", 0.6, 0)),
    (("Equalize", 0.4, 0), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 0)),
    (("Invert", 0.6, 0), ("Equalize", 1.0, 0)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 0), ("Equalize", 0.6, 0)),
)

# AugMix's op set leaves out the ops that overlap common corruptions (color, contrast, ...).
AUGMIX_OPS = ("AutoContrast", "Equalize", "Posterize", "Rotate", "Solarize", "ShearX", "ShearY",
              "TranslateX", "TranslateY")


class AutoAugment(Transform):
    """Apply one uniformly chosen sub-policy of ``policy`` (each step with its probability).

    Args:
        policy: sub-policies of ``(op name, probability, magnitude 0..10)`` steps.
    """

    input_kind = "pil"

    def __init__(self, policy: Sequence[Sequence[Tuple[str, float, int]]] = IMAGENET_POLICY):
        unknown = sorted({name for sub in policy for name, _, _ in sub} - set(_OPS))
        if unknown:
            raise ValueError(f"AutoAugment: unknown op(s) {unknown}; known: {sorted(_OPS)}")
        self.policy = tuple(tuple(sub) for sub in policy)

    def __repr__(self) -> str:
        return f"AutoAugment({len(self.policy)} sub-policies)"

    def __call__(self, img: Image.Image, rng=None) -> Image.Image:
        rng = require_rng(rng, self)
        for name, prob, magnitude in self.policy[int(rng.integers(len(self.policy)))]:
            if rng.random() < prob:
                img = apply_op(img, name, magnitude / 10.0, rng)
        return img


class AugMix(Transform):
    """AugMix (Hendrycks et al., 2020): mix ``width`` random op chains, then blend with the input.

    ``out = (1 - m) * img + m * sum_i w_i * chain_i(img)`` with ``w ~ Dirichlet(alpha)`` and
    ``m ~ Beta(alpha, alpha)``; each chain has ``depth`` ops (1..3 when depth <= 0) at a
    strength drawn in [0.1, severity] / 10.

    Args:
        severity: upper bound of the op strength on a 0..10 scale.
        width: number of chains mixed.
        depth: ops per chain; <= 0 draws 1..3 per chain.
        alpha: Dirichlet / Beta concentration.
    Returns (on call):
        An (H, W, 3) uint8 array.
    """

    input_kind = "pil"

    def __init__(self, severity: float = 3.0, width: int = 3, depth: int = -1, alpha: float = 1.0):
        if not 0 < severity <= 10:
            raise ValueError(f"AugMix: severity must be in (0, 10], got {severity}")
        self.severity = float(severity)
        self.width = int(width)
        self.depth = int(depth)
        self.alpha = float(alpha)

    def __call__(self, img: Image.Image, rng=None) -> np.ndarray:
        rng = require_rng(rng, self)
        weights = rng.dirichlet([self.alpha] * self.width)
        blend = rng.beta(self.alpha, self.alpha)
        mix = np.zeros((img.height, img.width, 3), dtype=np.float32)
        for weight in weights:
            chain = img
            depth = self.depth if self.depth > 0 else int(rng.integers(1, 4))
            for _ in range(depth):
                name = AUGMIX_OPS[int(rng.integers(len(AUGMIX_OPS)))]
                chain = apply_op(chain, name, rng.uniform(0.1, self.severity) / 10.0, rng)
            mix += np.float32(weight) * np.asarray(chain, dtype=np.float32)
        mixed = (1.0 - blend) * np.asarray(img, dtype=np.float32) + blend * mix
        return np.clip(np.rint(mixed), 0, 255).astype(np.uint8)
