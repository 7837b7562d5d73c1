"""Procedural drawing of pedestrian-like 128x64 crops for the SyntheticReID benchmark.

An :class:`Identity` fixes what a person looks like (body shape, skin, hair, clothing
colors and pattern, shoes, bag); a :class:`Camera` fixes a scene (background, lighting,
color cast, blur, how often people face it); :func:`render_image` draws one sighting with
per-image pose, scale, offset, mirror view, occlusion, blur and noise. Everything is drawn
at twice the output size and reduced, which anti-aliases the shapes.
"""

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

Color = Tuple[int, int, int]

OUT_H, OUT_W = 128, 64
SS = 2  # supersampling factor
H, W = OUT_H * SS, OUT_W * SS
BG_MARGIN = 24  # extra background around the frame so each image can crop it differently

CLOTH_COLORS: Tuple[Color, ...] = (
    (28, 28, 30), (228, 228, 222), (128, 128, 130), (32, 42, 92), (52, 92, 180),
    (135, 172, 220), (182, 32, 38), (110, 26, 32), (42, 122, 54), (100, 110, 52),
    (222, 192, 52), (222, 122, 42), (102, 52, 132), (222, 142, 172), (202, 182, 142),
    (110, 76, 46), (62, 82, 132), (32, 122, 122),
)
SKIN_TONES: Tuple[Color, ...] = ((250, 218, 190), (232, 188, 158), (200, 150, 114),
                                 (160, 110, 80), (120, 80, 56), (88, 60, 42))
HAIR_COLORS: Tuple[Color, ...] = ((22, 20, 20), (62, 42, 30), (112, 76, 46), (200, 170, 112),
                                  (152, 150, 148), (132, 62, 36))
SHOE_COLORS: Tuple[Color, ...] = ((24, 24, 24), (232, 232, 232), (104, 70, 44), (120, 120, 124),
                                  (176, 36, 36), (44, 70, 150))
SCENE_COLORS: Tuple[Color, ...] = ((150, 150, 150), (112, 112, 118), (170, 96, 80),
                                   (190, 176, 150), (96, 130, 90), (140, 150, 170),
                                   (80, 80, 86), (200, 200, 196), (120, 100, 80))

# The colours of another city: SyntheticReIDShifted's clothing and scenes (no colour of
# the street palettes above), selected by SyntheticSpec.cloth_palette / scene_palette.
SHIFTED_CLOTH_COLORS: Tuple[Color, ...] = (
    (248, 92, 162), (250, 236, 122), (122, 228, 198), (182, 142, 228), (252, 162, 112),
    (92, 198, 92), (62, 30, 82), (20, 72, 62), (162, 62, 22), (72, 52, 22),
    (198, 220, 92), (92, 162, 252), (42, 40, 62), (238, 202, 222), (150, 42, 102),
    (232, 102, 32), (102, 142, 122), (14, 14, 40),
)
SHIFTED_SCENE_COLORS: Tuple[Color, ...] = ((72, 112, 62), (42, 62, 42), (162, 142, 102),
                                           (62, 62, 92), (122, 72, 52), (32, 30, 36),
                                           (92, 122, 112), (182, 162, 202), (112, 92, 62))
# name -> (clothing colours, indices of the dark colours that lower garments favour)
CLOTH_PALETTES = {"street": (CLOTH_COLORS, (0, 2, 3, 16, 15, 9)),
                  "shifted": (SHIFTED_CLOTH_COLORS, (6, 7, 9, 12, 14, 17))}
SCENE_PALETTES = {"street": SCENE_COLORS, "shifted": SHIFTED_SCENE_COLORS}

PATTERNS = ("plain", "stripes", "checks", "logo")
HAIR_STYLES = ("short", "long", "bald", "cap")
LOWER_STYLES = ("trousers", "shorts", "skirt")
BAGS = ("none", "backpack", "shoulder", "handbag")


@dataclass(frozen=True)
class Identity:
    """What one person looks like (fixed over all of their images)."""

    height: float          # fraction of the frame height
    build: float           # width factor
    skin: Color
    hair: Color
    hair_style: str
    cap: Color
    upper: Color
    lower: Color
    outfit: int            # index of the (upper, lower) pair in the shared outfit table
    pattern: str
    pattern_color: Color
    logo_shape: int
    long_sleeves: bool
    lower_style: str
    shoes: Color
    bag: str
    bag_color: Color
    bag_side: int          # -1 left, +1 right (before mirroring)


@dataclass(frozen=True)
class Camera:
    """One camera's scene and imaging conditions."""

    background: np.ndarray  # uint8 (H + 2 * BG_MARGIN, W + 2 * BG_MARGIN, 3) at 2x size
    gain: Tuple[float, float, float]  # per-channel color cast times brightness
    haze: float             # blend towards a flat haze color
    haze_color: Color
    blur: float             # base blur radius at output size
    front_prob: float       # probability that a person faces this camera
    scale: float            # person size bias (far / near camera)


def _pick(rng: np.random.Generator, options: Sequence):
    return options[int(rng.integers(len(options)))]


def _jitter(rng: np.random.Generator, color: Color, amount: int) -> Color:
    return tuple(int(np.clip(c + rng.integers(-amount, amount + 1), 0, 255)) for c in color)


def make_outfit_table(rng: np.random.Generator, size: int, palette: str = "street") -> List[Tuple[Color, Color]]:
    """Draw ``size`` (upper, lower) color pairs shared by all identities.

    A small table makes groups of identities wear the same colors, so that color alone
    does not identify a person. Lower garments favor dark / denim colors, as in real
    street scenes.

    Args:
        rng: the table's generator.
        size: the number of pairs.
        palette: a key of :data:`CLOTH_PALETTES`.
    Returns:
        The list of (upper, lower) colors.
    """
    colors, dark_idx = CLOTH_PALETTES[palette]
    dark = [colors[i] for i in dark_idx]
    table = []
    for _ in range(size):
        upper = _pick(rng, colors)
        lower = _pick(rng, dark) if rng.random() < 0.7 else _pick(rng, colors)
        table.append((upper, lower))
    return table


def make_identity(rng: np.random.Generator, outfits: Sequence[Tuple[Color, Color]],
                  palette: str = "street") -> Identity:
    """Draw one identity; its clothing colors come from the shared ``outfits`` table.

    Args:
        rng: the identity's generator.
        outfits: the shared (upper, lower) table of :func:`make_outfit_table`.
        palette: a key of :data:`CLOTH_PALETTES` (pattern, cap and bag colors).
    Returns:
        The :class:`Identity`.
    """
    colors = CLOTH_PALETTES[palette][0]
    outfit = int(rng.integers(len(outfits)))
    upper, lower = outfits[outfit]
    pattern = _pick(rng, PATTERNS)
    pattern_color = _pick(rng, [c for c in colors if sum(abs(a - b) for a, b in
                                                                zip(c, upper)) > 150])
    return Identity(
        height=float(rng.uniform(0.80, 0.93)),
        build=float(rng.uniform(0.85, 1.2)),
        skin=_pick(rng, SKIN_TONES),
        hair=_pick(rng, HAIR_COLORS),
        hair_style=_pick(rng, HAIR_STYLES),
        cap=_pick(rng, colors),
        upper=_jitter(rng, upper, 6),
        lower=_jitter(rng, lower, 6),
        outfit=outfit,
        pattern=pattern,
        pattern_color=pattern_color,
        logo_shape=int(rng.integers(3)),
        long_sleeves=bool(rng.random() < 0.6),
        lower_style=_pick(rng, LOWER_STYLES) if rng.random() < 0.5 else "trousers",
        shoes=_pick(rng, SHOE_COLORS),
        bag=_pick(rng, BAGS),
        bag_color=_pick(rng, colors),
        bag_side=1 if rng.random() < 0.5 else -1,
    )


def _make_background(rng: np.random.Generator, scene_colors: Sequence[Color] = SCENE_COLORS) -> np.ndarray:
    """A scene: wall / sky above a floor, with panels, windows, a kerb and floor lines."""
    bh, bw = H + 2 * BG_MARGIN, W + 2 * BG_MARGIN
    img = Image.new("RGB", (bw, bh), _jitter(rng, _pick(rng, scene_colors), 20))
    draw = ImageDraw.Draw(img)
    horizon = int(bh * rng.uniform(0.45, 0.7))
    floor = _jitter(rng, _pick(rng, scene_colors), 20)
    draw.rectangle([0, horizon, bw, bh], fill=floor)
    x = int(rng.integers(-40, 0))
    while x < bw:  # wall panels / shop fronts of varying color
        pw = int(rng.integers(30, 90))
        if rng.random() < 0.6:
            draw.rectangle([x, int(rng.integers(0, horizon // 3)), x + pw, horizon],
                           fill=_jitter(rng, _pick(rng, scene_colors), 25))
        if rng.random() < 0.5:  # windows
            wc = _jitter(rng, (60, 70, 90) if rng.random() < 0.5 else (180, 200, 215), 20)
            for wy in range(int(rng.integers(8, 30)), horizon - 30, int(rng.integers(36, 60))):
                draw.rectangle([x + 6, wy, x + pw - 6, wy + int(rng.integers(14, 26))], fill=wc)
        x += pw
    draw.rectangle([0, horizon - 4, bw, horizon + 2], fill=_jitter(rng, (90, 90, 90), 30))
    line = _jitter(rng, floor, 30)
    for _ in range(int(rng.integers(2, 6))):  # floor tiles / road markings in perspective
        x0 = int(rng.integers(0, bw))
        draw.line([x0, horizon, x0 + int(rng.integers(-120, 120)), bh], fill=line, width=3)
    for _ in range(int(rng.integers(0, 4))):  # horizontal tile lines
        y = int(rng.integers(horizon + 6, bh))
        draw.line([0, y, bw, y], fill=line, width=2)
    img = img.filter(ImageFilter.GaussianBlur(1.5))
    return np.asarray(img, dtype=np.uint8)


def make_camera(rng: np.random.Generator, cast_strength: float, *, scene_palette: str = "street",
                brightness: Tuple[float, float] = (0.7, 1.15), cast_bias: Sequence[float] = (0.0, 0.0, 0.0),
                front_prob: Tuple[float, float] = (0.25, 0.75), scale: Tuple[float, float] = (0.9, 1.05)) -> Camera:
    """Draw one camera: its scene, brightness, color cast, haze and blur.

    The keyword defaults are SyntheticReID's cameras (the draws are the same for them).

    Args:
        rng: the camera's generator.
        cast_strength: the largest per-channel deviation of the color cast (0 = none).
        scene_palette: a key of :data:`SCENE_PALETTES` (background colors).
        brightness: (min, max) of the camera's brightness factor.
        cast_bias: a per-channel (R, G, B) offset of every camera's cast (a lighting
            type shared by the network, e.g. warm street lamps).
        front_prob: (min, max) of the probability that a person faces the camera (viewpoint).
        scale: (min, max) of the person-size factor (camera distance).
    Returns:
        The :class:`Camera`.
    """
    gain_level = rng.uniform(*brightness)
    cast = 1.0 + cast_strength * rng.uniform(-1.0, 1.0, size=3) + np.asarray(cast_bias, dtype=np.float64)
    gain = tuple(float(g) for g in cast * gain_level)
    return Camera(
        background=_make_background(rng, SCENE_PALETTES[scene_palette]),
        gain=gain,  # type: ignore[arg-type]
        haze=float(rng.uniform(0.0, 0.2)),
        haze_color=_jitter(rng, (170, 175, 185), 30),
        blur=float(rng.uniform(0.0, 0.8)),
        front_prob=float(rng.uniform(*front_prob)),
        scale=float(rng.uniform(*scale)),
    )


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
    color = _jitter(rng, _pick(rng, SCENE_COLORS + CLOTH_COLORS), 20)
    if rng.random() < 0.55:
        top = int(H * rng.uniform(0.55, 0.8))
        x0, x1 = sorted(int(v) for v in rng.integers(-W // 2, W + W // 2, size=2))
        x0, x1 = min(x0, W // 4), max(x1, 3 * W // 4)
        draw.rounded_rectangle([x0, top, x1, H + 10], radius=8, fill=color)
    else:
        width = int(W * rng.uniform(0.18, 0.38))
        x0 = -10 if rng.random() < 0.5 else W - width
        draw.rectangle([x0, -10, x0 + width + 10, H + 10], fill=color)


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
    phase = rng.uniform(-1.0, 1.0)
    spread = (0.03 * max(phase, 0) + 0.005, 0.03 * max(-phase, 0) + 0.005)
    swing = (0.025 * phase, -0.025 * phase)

    _draw_bag(draw, body, ident, front, before_body=True)
    _draw_legs(draw, body, ident, spread)
    _draw_torso(img, body, ident, front)
    draw = ImageDraw.Draw(img)
    _draw_arms(draw, body, ident, swing)
    _draw_head(draw, body, ident, front)
    _draw_bag(draw, body, ident, front, before_body=False)
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
