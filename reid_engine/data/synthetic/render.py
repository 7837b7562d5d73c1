"""Procedural drawing of pedestrian-like 128x64 crops for the SyntheticReID benchmark.

:func:`render_image` draws one sighting of an :class:`~.appearance.Identity` seen by a
:class:`~.appearance.Camera` (both drawn in :mod:`.appearance`, whose names are re-exported
here) with per-image pose, scale, offset, mirror view, occlusion, blur and noise.
Everything is drawn at twice the output size and reduced, which anti-aliases the shapes.
"""

from typing import List, Tuple

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from .appearance import (
    BG_MARGIN,
    CLOTH_COLORS,
    CLOTH_PALETTES,
    OUT_H,
    OUT_W,
    SCENE_COLORS,
    SCENE_PALETTES,
    SHIFTED_CLOTH_COLORS,
    SHIFTED_SCENE_COLORS,
    SS,
    Camera,
    Color,
    H,
    Identity,
    W,
    jitter,
    make_camera,
    make_identity,
    make_outfit_table,
    pick,
)

__all__ = [
    "render_image", "draw_person",
    # re-exported from .appearance, where they moved
    "OUT_H", "OUT_W", "CLOTH_COLORS", "SHIFTED_CLOTH_COLORS", "SCENE_COLORS", "SHIFTED_SCENE_COLORS",
    "CLOTH_PALETTES", "SCENE_PALETTES", "Identity", "Camera", "make_outfit_table", "make_identity", "make_camera",
]


class _Body:
    """Maps person-local coordinates (units of the person height, x mirrored) to pixels."""

    def __init__(self, cx: float, feet_y: float, height_px: float, mirror: bool):
        self.cx, self.feet_y, self.h = cx, feet_y, height_px
        self.sx = -1.0 if mirror else 1.0

    def pt(self, x: float, y: float) -> Tuple[float, float]:
        """Pixel of the local point (x right of centre, y down from the head top)."""
        return self.cx + self.sx * x * self.h, self.feet_y - (1.0 - y) * self.h

    def box(self, x0: float, y0: float, x1: float, y1: float) -> List[float]:
        """Pixel bounding box ``[left, top, right, bottom]`` of a local box."""
        (a, b), (c, d) = self.pt(x0, y0), self.pt(x1, y1)
        return [min(a, c), min(b, d), max(a, c), max(b, d)]

    def px(self, length: float) -> int:
        """A local length in pixels (at least 1)."""
        return max(1, int(round(length * self.h)))


def _draw_torso(img: Image.Image, body: _Body, ident: Identity, front: bool) -> None:
    """Torso trapezoid with the identity's clothing pattern, clipped to the torso."""
    b = ident.build
    poly = [body.pt(-0.13 * b, 0.15), body.pt(0.13 * b, 0.15), body.pt(0.108 * b, 0.52),
            body.pt(-0.108 * b, 0.52)]
    mask = Image.new("L", img.size, 0)
    ImageDraw.Draw(mask).polygon(poly, fill=255)
    cloth = Image.new("RGB", img.size, ident.upper)
    draw = ImageDraw.Draw(cloth)
    top, bottom = body.pt(0, 0.15)[1], body.pt(0, 0.52)[1]
    step = body.px(0.028)
    if ident.pattern == "stripes":
        for k, y in enumerate(np.arange(top, bottom, step)):
            if k % 2:
                draw.rectangle([0, y, img.size[0], y + step - 1], fill=ident.pattern_color)
    elif ident.pattern == "checks":
        for j, y in enumerate(np.arange(top, bottom, step)):
            for i, x in enumerate(np.arange(body.cx - 0.2 * body.h, body.cx + 0.2 * body.h,
                                            step)):
                if (i + j) % 2:
                    draw.rectangle([x, y, x + step - 1, y + step - 1], fill=ident.pattern_color)
    elif ident.pattern == "logo" and front:
        cx, cy = body.pt(0.0, 0.27)
        r = 0.04 * body.h
        if ident.logo_shape == 0:
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=ident.pattern_color)
        elif ident.logo_shape == 1:
            draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)],
                         fill=ident.pattern_color)
        else:
            draw.rectangle([cx - r, cy - 0.6 * r, cx + r, cy + 0.6 * r], fill=ident.pattern_color)
    img.paste(cloth, (0, 0), mask)


def _draw_limb(draw: ImageDraw.ImageDraw, body: _Body, a, b, width: float, color: Color):
    """A thick segment between local points ``a`` and ``b`` with rounded ends."""
    pa, pb = body.pt(*a), body.pt(*b)
    w = body.px(width)
    draw.line([pa, pb], fill=color, width=w)
    for p in (pa, pb):
        draw.ellipse([p[0] - w / 2, p[1] - w / 2, p[0] + w / 2, p[1] + w / 2], fill=color)


def _draw_legs(draw, body: _Body, ident: Identity, spread: Tuple[float, float]) -> None:
    """Legs (trousers / shorts / skirt with bare legs) and shoes."""
    b = ident.build
    for side, s in ((-1, spread[0]), (1, spread[1])):
        hip = (side * 0.052 * b, 0.50)
        knee = (side * (0.056 * b + 0.5 * s), 0.73)
        ankle = (side * (0.056 * b + s), 0.955)
        if ident.lower_style == "trousers":
            _draw_limb(draw, body, hip, knee, 0.078 * b, ident.lower)
            _draw_limb(draw, body, knee, ankle, 0.066 * b, ident.lower)
        else:
            _draw_limb(draw, body, hip, knee, 0.055 * b, ident.skin)
            _draw_limb(draw, body, knee, ankle, 0.05 * b, ident.skin)
            if ident.lower_style == "shorts":
                _draw_limb(draw, body, hip, (side * (0.056 * b + 0.3 * s), 0.65), 0.082 * b,
                           ident.lower)
        draw.ellipse(body.box(ankle[0] - 0.04, 0.94, ankle[0] + 0.04, 1.0), fill=ident.shoes)
    if ident.lower_style == "skirt":
        draw.polygon([body.pt(-0.108 * b, 0.49), body.pt(0.108 * b, 0.49),
                      body.pt(0.155 * b, 0.70), body.pt(-0.155 * b, 0.70)], fill=ident.lower)


def _draw_arms(draw, body: _Body, ident: Identity, swing: Tuple[float, float]) -> None:
    """Arms (sleeves to the elbow or the wrist) and hands."""
    b = ident.build
    sleeve_low = ident.upper if ident.long_sleeves else ident.skin
    for side, s in ((-1, swing[0]), (1, swing[1])):
        shoulder = (side * 0.135 * b, 0.17)
        elbow = (side * (0.152 * b + 0.3 * s), 0.33)
        hand = (side * (0.148 * b + s), 0.48)
        _draw_limb(draw, body, shoulder, elbow, 0.05 * b, ident.upper)
        _draw_limb(draw, body, elbow, hand, 0.042 * b, sleeve_low)
        draw.ellipse(body.box(hand[0] - 0.024, hand[1] - 0.01, hand[0] + 0.024, hand[1] + 0.035),
                     fill=ident.skin)


def _draw_head(draw, body: _Body, ident: Identity, front: bool) -> None:
    """Neck, head, face hints (front view) and hair / cap."""
    draw.rectangle(body.box(-0.025, 0.10, 0.025, 0.16), fill=ident.skin)
    if ident.hair_style == "long":  # hair falling behind the shoulders
        draw.rectangle(body.box(-0.06, 0.05, 0.06, 0.21 if front else 0.25), fill=ident.hair)
    draw.ellipse(body.box(-0.05, 0.005, 0.05, 0.125), fill=ident.skin)
    if ident.hair_style in ("short", "long"):
        if front:
            draw.chord(body.box(-0.054, 0.0, 0.054, 0.11), 180, 360, fill=ident.hair)
        else:
            draw.ellipse(body.box(-0.054, 0.0, 0.054, 0.12), fill=ident.hair)
    elif ident.hair_style == "cap":
        draw.chord(body.box(-0.056, -0.005, 0.056, 0.10), 180, 360, fill=ident.cap)
        if front:
            draw.rectangle(body.box(-0.06, 0.045, 0.07, 0.058), fill=ident.cap)
    if front:
        eye = (40, 30, 28)
        for x in (-0.02, 0.02):
            draw.ellipse(body.box(x - 0.007, 0.06, x + 0.007, 0.072), fill=eye)


def _draw_bag(draw, body: _Body, ident: Identity, front: bool, before_body: bool) -> None:
    """The bag: a backpack (straps in front, the pack on the back) or a side bag."""
    side, b, color = ident.bag_side, ident.build, ident.bag_color
    if ident.bag == "backpack":
        if front and not before_body:
            for x in (-0.08 * b, 0.08 * b):
                _draw_limb(draw, body, (x, 0.16), (x * 0.9, 0.36), 0.018, color)
        elif front and before_body:  # the pack peeks out on its side
            draw.rounded_rectangle(body.box(side * 0.10 * b, 0.18, side * 0.165 * b, 0.42),
                                   radius=body.px(0.02), fill=color)
        elif not front and not before_body:
            draw.rounded_rectangle(body.box(-0.095 * b, 0.18, 0.095 * b, 0.44),
                                   radius=body.px(0.025), fill=color)
            draw.line([body.pt(-0.06 * b, 0.30), body.pt(0.06 * b, 0.30)],
                      fill=tuple(max(0, c - 50) for c in color), width=body.px(0.01))
    elif ident.bag == "shoulder" and not before_body:
        _draw_limb(draw, body, (-side * 0.10 * b, 0.16), (side * 0.135 * b, 0.45), 0.014,
                   tuple(max(0, c - 40) for c in color))
        draw.rectangle(body.box(side * 0.115 * b, 0.42, side * 0.215 * b, 0.53), fill=color)
    elif ident.bag == "handbag" and not before_body:
        draw.rectangle(body.box(side * 0.125 * b, 0.49, side * 0.205 * b, 0.58), fill=color)


def _draw_occluder(draw, rng: np.random.Generator) -> None:
    """A random partial occluder: something low in front (bench, car, box) or a side edge."""
    color = jitter(rng, pick(rng, SCENE_COLORS + CLOTH_COLORS), 20)
    if rng.random() < 0.55:
        top = int(H * rng.uniform(0.55, 0.8))
        x0, x1 = sorted(int(v) for v in rng.integers(-W // 2, W + W // 2, size=2))
        x0, x1 = min(x0, W // 4), max(x1, 3 * W // 4)
        draw.rounded_rectangle([x0, top, x1, H + 10], radius=8, fill=color)
    else:
        width = int(W * rng.uniform(0.18, 0.38))
        x0 = -10 if rng.random() < 0.5 else W - width
        draw.rectangle([x0, -10, x0 + width + 10, H + 10], fill=color)


def draw_person(img: Image.Image, body: _Body, ident: Identity, front: bool, phase: float) -> None:
    """Draw ``ident`` at ``body`` onto ``img`` (supersampled canvas), seen from the front or back.

    Args:
        phase: the walking phase in [-1, 1]: how far the legs spread and the arms swing.
    """
    draw = ImageDraw.Draw(img)
    spread = (0.03 * max(phase, 0) + 0.005, 0.03 * max(-phase, 0) + 0.005)
    swing = (0.025 * phase, -0.025 * phase)
    _draw_bag(draw, body, ident, front, before_body=True)
    _draw_legs(draw, body, ident, spread)
    _draw_torso(img, body, ident, front)
    draw = ImageDraw.Draw(img)  # the torso pastes onto the image
    _draw_arms(draw, body, ident, swing)
    _draw_head(draw, body, ident, front)
    _draw_bag(draw, body, ident, front, before_body=False)


def render_image(ident: Identity, cam: Camera, rng: np.random.Generator, occlusion_prob: float,
                 noise: float, blur: float) -> Image.Image:
    """Draw one 128x64 RGB sighting of ``ident`` seen by ``cam``.

    Args:
        ident: who is seen.
        cam: which camera sees them.
        rng: this image's generator (pose, view, occlusion, noise).
        occlusion_prob: probability of a partial occluder.
        noise: the largest standard deviation of the additive pixel noise (0..255 scale).
        blur: the largest extra blur radius (output pixels) on top of the camera's.
    Returns:
        A PIL RGB image of size 64x128 (W x H).
    """
    ox, oy = (int(v) for v in rng.integers(0, 2 * BG_MARGIN + 1, size=2))
    img = Image.fromarray(cam.background[oy:oy + H, ox:ox + W])
    draw = ImageDraw.Draw(img)
    front = bool(rng.random() < cam.front_prob)
    height = ident.height * cam.scale * rng.uniform(0.9, 1.05) * H
    body = _Body(cx=W / 2 + rng.uniform(-0.07, 0.07) * W,
                 feet_y=H - 0.03 * H + rng.uniform(-0.03, 0.03) * H + (H * 0.93 - height) * 0.3,
                 height_px=height, mirror=bool(rng.random() < 0.5))
    draw_person(img, body, ident, front, phase=rng.uniform(-1.0, 1.0))
    draw = ImageDraw.Draw(img)
    if rng.random() < occlusion_prob:
        _draw_occluder(draw, rng)

    img = img.reduce(SS)
    radius = cam.blur + rng.uniform(0.0, blur)
    if radius > 0.15:
        img = img.filter(ImageFilter.GaussianBlur(radius))
    arr = np.asarray(img, dtype=np.float32)
    light = rng.uniform(0.92, 1.08)
    arr = arr * (np.asarray(cam.gain, dtype=np.float32) * light)
    arr = arr * (1.0 - cam.haze) + np.asarray(cam.haze_color, dtype=np.float32) * cam.haze
    if noise > 0:
        arr += rng.normal(0.0, rng.uniform(0.3, 1.0) * noise, size=arr.shape).astype(np.float32)
    return Image.fromarray(np.clip(arr + 0.5, 0, 255).astype(np.uint8))
