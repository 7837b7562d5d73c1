"""What the people and the cameras of SyntheticReID look like, and their random draws.

An :class:`Identity` fixes what a person looks like (body shape, skin, hair, clothing
colors and pattern, shoes, bag); a :class:`Camera` fixes a scene (background, lighting,
color cast, blur, how often people face it). The palettes they draw from, and the frame
size the scenes are drawn at (twice the output size), are here too; :mod:`.render` draws
the sightings.
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


def pick(rng: np.random.Generator, options: Sequence):
    """One of `options`, drawn uniformly."""
    return options[int(rng.integers(len(options)))]


def jitter(rng: np.random.Generator, color: Color, amount: int) -> Color:
    """`color` with each channel moved by up to `amount` (clipped to 0..255)."""
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
        upper = pick(rng, colors)
        lower = pick(rng, dark) if rng.random() < 0.7 else pick(rng, colors)
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
    pattern = pick(rng, PATTERNS)
    pattern_color = pick(rng, [c for c in colors if sum(abs(a - b) for a, b in
                                                                zip(c, upper)) > 150])
    return Identity(
        height=float(rng.uniform(0.80, 0.93)),
        build=float(rng.uniform(0.85, 1.2)),
        skin=pick(rng, SKIN_TONES),
        hair=pick(rng, HAIR_COLORS),
        hair_style=pick(rng, HAIR_STYLES),
        cap=pick(rng, colors),
        upper=jitter(rng, upper, 6),
        lower=jitter(rng, lower, 6),
        outfit=outfit,
        pattern=pattern,
        pattern_color=pattern_color,
        logo_shape=int(rng.integers(3)),
        long_sleeves=bool(rng.random() < 0.6),
        lower_style=pick(rng, LOWER_STYLES) if rng.random() < 0.5 else "trousers",
        shoes=pick(rng, SHOE_COLORS),
        bag=pick(rng, BAGS),
        bag_color=pick(rng, colors),
        bag_side=1 if rng.random() < 0.5 else -1,
    )


def _make_background(rng: np.random.Generator, scene_colors: Sequence[Color] = SCENE_COLORS) -> np.ndarray:
    """A scene: wall / sky above a floor, with panels, windows, a kerb and floor lines."""
    bh, bw = H + 2 * BG_MARGIN, W + 2 * BG_MARGIN
    img = Image.new("RGB", (bw, bh), jitter(rng, pick(rng, scene_colors), 20))
    draw = ImageDraw.Draw(img)
    horizon = int(bh * rng.uniform(0.45, 0.7))
    floor = jitter(rng, pick(rng, scene_colors), 20)
    draw.rectangle([0, horizon, bw, bh], fill=floor)
    x = int(rng.integers(-40, 0))
    while x < bw:  # wall panels / shop fronts of varying color
        pw = int(rng.integers(30, 90))
        if rng.random() < 0.6:
            draw.rectangle([x, int(rng.integers(0, horizon // 3)), x + pw, horizon],
                           fill=jitter(rng, pick(rng, scene_colors), 25))
        if rng.random() < 0.5:  # windows
            wc = jitter(rng, (60, 70, 90) if rng.random() < 0.5 else (180, 200, 215), 20)
            for wy in range(int(rng.integers(8, 30)), horizon - 30, int(rng.integers(36, 60))):
                draw.rectangle([x + 6, wy, x + pw - 6, wy + int(rng.integers(14, 26))], fill=wc)
        x += pw
    draw.rectangle([0, horizon - 4, bw, horizon + 2], fill=jitter(rng, (90, 90, 90), 30))
    line = jitter(rng, floor, 30)
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
        haze_color=jitter(rng, (170, 175, 185), 30),
        blur=float(rng.uniform(0.0, 0.8)),
        front_prob=float(rng.uniform(*front_prob)),
        scale=float(rng.uniform(*scale)),
    )
