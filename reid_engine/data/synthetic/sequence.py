"""A short multi-person video of SyntheticReID's people, with ground-truth boxes and identities.

For tracking: people walk across one camera's scene in pairs at about the same depth. The
two of a pair walk towards each other, meet, and then either pass (the nearer one hides
the other for a few frames) or both turn back where they met. A tracker that predicts
motion alone cannot tell, at the meeting, which of the two boxes that leave is whom: it
swaps their identities whenever the pair turns back. An appearance model can.

The people are the test identities of a `SyntheticSpec` (SyntheticReID's by default, so a
model trained on its training split has never seen them), drawn with the same body parts
as the benchmark's crops (:mod:`.render`), on the camera's scene, with its lighting.
Ground-truth boxes frame a person as the benchmark's 128x64 crops do (2:1, the person
about 0.87 of the height); a person is listed in a frame when at least `min_visible` of
their box is not covered by the boxes of people nearer to the camera.
"""

from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np
from PIL import Image

from .appearance import SS
from .generator import DEFAULT_SPEC, SyntheticSpec, SyntheticWorld
from .render import _Body, draw_person

__all__ = ["SequenceSpec", "TINY_SEQUENCE_SPEC", "Walker", "SyntheticSequence", "plan_walkers", "render_sequence",
           "person_box"]

# the person's height over the box height in the benchmark's crops (render_image: 0.80-0.93 x scale)
_PERSON_FILL = 0.87


@dataclass(frozen=True)
class SequenceSpec:
    """The settings of a synthetic tracking sequence.

    Args:
        people: the identities, cameras and rendering settings (its test identities walk).
        num_pairs: pairs of people; each pair meets once.
        num_frames: frames of the sequence.
        frame_size: (height, width) of a frame in pixels.
        person_height: (min, max) of a person's height, as a fraction of the frame height.
        turn_prob: probability that a pair turns back where it meets (else it passes).
        min_visible: smallest visible fraction of a box that is still listed (detected).
        noise: standard deviation of the pixel noise (0..255).
        camera: which camera of `people` films the scene.
        seed: the seed of the walks.
    """

    people: SyntheticSpec = field(default_factory=lambda: DEFAULT_SPEC)
    num_pairs: int = 3
    num_frames: int = 80
    frame_size: Tuple[int, int] = (270, 480)
    person_height: Tuple[float, float] = (0.34, 0.4)
    turn_prob: float = 0.7
    min_visible: float = 0.5
    noise: float = 3.0
    camera: int = 0
    seed: int = 0


#: a few frames of one pair, for tests
TINY_SEQUENCE_SPEC = SequenceSpec(num_pairs=1, num_frames=12, frame_size=(160, 240), turn_prob=1.0)


@dataclass(frozen=True)
class Walker:
    """One person's walk: who, where their feet are at each frame, how tall, which view."""

    identity: int          # index into the world's identities
    track_id: int          # the ground-truth id, 1-based
    xs: np.ndarray         # (num_frames,) horizontal centre of the feet, pixels
    feet_y: float          # bottom of the feet, pixels (the depth: larger is nearer)
    height: float          # person height, pixels
    front: bool            # faces the camera (else shows the back)


@dataclass
class SyntheticSequence:
    """The frames and their ground truth.

    Attributes:
        frames: RGB uint8 (H, W, 3) arrays.
        boxes: per frame, (n, 4) float32 ``x1, y1, x2, y2`` of the people listed in it.
        ids: per frame, (n,) int64 ground-truth ids of those boxes.
    """

    frames: List[np.ndarray]
    boxes: List[np.ndarray]
    ids: List[np.ndarray]


def person_box(x: float, feet_y: float, height: float) -> np.ndarray:
    """The ground-truth box ``x1, y1, x2, y2`` of a person whose feet are at (x, feet_y)."""
    box_h = height / _PERSON_FILL
    bottom = feet_y + 0.03 * box_h
    return np.array([x - box_h / 4, bottom - box_h, x + box_h / 4, bottom], dtype=np.float32)


def plan_walkers(spec: SequenceSpec) -> List[Walker]:
    """The walks of every person of `spec` (deterministic)."""
    rng = np.random.default_rng([spec.seed, 11])
    frame_h, frame_w = spec.frame_size
    first = spec.people.num_train_ids  # the test identities follow the training ones
    people = rng.choice(spec.people.num_test_ids, 2 * spec.num_pairs, replace=False) + first
    t = np.arange(spec.num_frames, dtype=np.float64)
    walkers = []
    for p in range(spec.num_pairs):
        heights = frame_h * rng.uniform(*spec.person_height, size=2)
        margin = heights.max() / _PERSON_FILL / 4 + 2  # half a box width: boxes stay inside the frame
        # the pairs' depths spread over the floor; within a pair a few pixels apart
        feet = frame_h * (0.5 + 0.45 * (p + rng.uniform(0.2, 0.8)) / spec.num_pairs)
        meet_x = rng.uniform(0.35, 0.65) * frame_w
        meet_t = rng.uniform(0.4, 0.6) * (spec.num_frames - 1)
        turn = bool(rng.random() < spec.turn_prob)
        for k, side in enumerate((-1, 1)):  # starts left walking right, and starts right walking left
            # from inside the frame to the meeting point
            speed = rng.uniform(0.6, 0.95) * (meet_x - margin if side < 0 else frame_w - margin - meet_x) / meet_t
            after = -1.0 if turn else 1.0
            offset = np.where(t <= meet_t, t - meet_t, after * (t - meet_t))
            xs = np.clip(meet_x - side * speed * offset, margin, frame_w - margin)
            walkers.append(Walker(identity=int(people[2 * p + k]), track_id=len(walkers) + 1, xs=xs,
                                  feet_y=float(feet + k * rng.uniform(2.0, 6.0)), height=float(heights[k]),
                                  front=bool(rng.random() < 0.5)))
    return walkers


def _visible_fraction(box: np.ndarray, nearer: List[np.ndarray]) -> float:
    """The fraction of `box` not covered by any box of `nearer` (on a coarse pixel grid)."""
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    if x2 <= x1 or y2 <= y1:
        return 0.0
    covered = np.zeros((y2 - y1, x2 - x1), dtype=bool)
    for other in nearer:
        a1, b1, a2, b2 = (int(round(v)) for v in other)
        covered[max(b1 - y1, 0):max(b2 - y1, 0), max(a1 - x1, 0):max(a2 - x1, 0)] = True
    return 1.0 - float(covered.mean())


def render_sequence(spec: SequenceSpec = SequenceSpec()) -> SyntheticSequence:
    """Render the frames of `spec` and their ground truth (deterministic)."""
    world = SyntheticWorld(spec.people)
    camera = world.cameras[spec.camera % len(world.cameras)]
    walkers = plan_walkers(spec)
    frame_h, frame_w = spec.frame_size
    scene = Image.fromarray(camera.background).resize((frame_w * SS, frame_h * SS), Image.BILINEAR)
    rng = np.random.default_rng([spec.seed, 12])
    gain = np.asarray(camera.gain, dtype=np.float32)
    haze = np.asarray(camera.haze_color, dtype=np.float32) * camera.haze
    by_depth = sorted(walkers, key=lambda w: w.feet_y)  # far ones first: nearer people hide them
    frames, boxes, ids = [], [], []
    for t in range(spec.num_frames):
        img = scene.copy()
        for w in by_depth:
            step = w.xs[min(t + 1, spec.num_frames - 1)] - w.xs[max(t - 1, 0)]
            # drawn on a patch around the person (the torso is drawn through masks of its image's size)
            x1, y1, x2, y2 = (person_box(w.xs[t], w.feet_y, w.height) * SS).tolist()
            left, top = int(x1 - 0.3 * (x2 - x1)), int(y1 - 0.1 * (y2 - y1))
            patch = img.crop((left, top, int(x2 + 0.3 * (x2 - x1)) + 1, int(y2) + 1))
            body = _Body(cx=w.xs[t] * SS - left, feet_y=w.feet_y * SS - top, height_px=w.height * SS,
                         mirror=bool(step < 0))
            draw_person(patch, body, world.identities[w.identity], w.front, np.sin(w.xs[t] / w.height * 6.0))
            img.paste(patch, (left, top))
        arr = np.asarray(img.reduce(SS), dtype=np.float32) * gain * (1.0 - camera.haze) + haze
        arr += rng.normal(0.0, spec.noise, size=arr.shape).astype(np.float32)
        frames.append(np.clip(arr + 0.5, 0, 255).astype(np.uint8))
        frame_boxes = [person_box(w.xs[t], w.feet_y, w.height) for w in by_depth]
        keep = [k for k, box in enumerate(frame_boxes)
                if _visible_fraction(box, frame_boxes[k + 1:]) >= spec.min_visible]
        boxes.append(np.array([frame_boxes[k] for k in keep], dtype=np.float32).reshape(-1, 4))
        ids.append(np.array([by_depth[k].track_id for k in keep], dtype=np.int64))
    return SyntheticSequence(frames=frames, boxes=boxes, ids=ids)
