"""Color ops: color jitter (brightness, contrast, saturation, hue in random order)."""

from typing import List, Tuple

import numpy as np
from PIL import Image, ImageEnhance

from .base import Transform, require_rng

__all__ = ["ColorJitter", "shift_hue"]


def shift_hue(img: Image.Image, shift: float) -> Image.Image:
    """Rotate the hue of ``img`` by ``shift`` turns (-0.5..0.5); grey pixels are unchanged."""
    hsv = np.array(img.convert("HSV"))
    # uint8 addition wraps around, which is exactly a rotation of the hue circle.
    hsv[..., 0] += np.uint8(int(round(shift * 255)) % 256)
    return Image.fromarray(hsv, mode="HSV").convert("RGB")


class ColorJitter(Transform):
    """Random brightness, contrast, saturation and hue changes, applied in a random order.

    Each factor is drawn uniformly: brightness / contrast / saturation in
    ``[max(0, 1 - x), 1 + x]`` and the hue shift in ``[-hue, hue]`` turns. Geometry is never
    touched.

    Args:
        brightness, contrast, saturation: maximum relative change (0 disables).
        hue: maximum hue rotation in turns, at most 0.5 (0 disables).
    """

    input_kind = "pil"

    def __init__(self, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0,
                 hue: float = 0.0):
        for name, value in (("brightness", brightness), ("contrast", contrast),
                            ("saturation", saturation), ("hue", hue)):
            if value < 0:
                raise ValueError(f"ColorJitter: {name} must be >= 0, got {value} (INPUT.CJ)")
        if hue > 0.5:
            raise ValueError(f"ColorJitter: hue must be <= 0.5, got {hue} (INPUT.CJ.HUE)")
        self.brightness = float(brightness)
        self.contrast = float(contrast)
        self.saturation = float(saturation)
        self.hue = float(hue)

    def get_params(self, rng: np.random.Generator) -> List[Tuple[str, float]]:
        """Return the enabled adjustments as ``[(name, factor), ...]`` in application order."""
        steps = []
        for name, span in (("brightness", self.brightness), ("contrast", self.contrast),
                           ("saturation", self.saturation)):
            if span > 0:
                steps.append((name, rng.uniform(max(0.0, 1 - span), 1 + span)))
        if self.hue > 0:
            steps.append(("hue", rng.uniform(-self.hue, self.hue)))
        order = rng.permutation(len(steps))
        return [steps[i] for i in order]

    def __call__(self, img: Image.Image, rng=None) -> Image.Image:
        for name, factor in self.get_params(require_rng(rng, self)):
            if name == "hue":
                img = shift_hue(img, factor)
            else:
                img = _ENHANCERS[name](img).enhance(factor)
        return img


_ENHANCERS = {
    "brightness": ImageEnhance.Brightness,
    "contrast": ImageEnhance.Contrast,
    "saturation": ImageEnhance.Color,
}
