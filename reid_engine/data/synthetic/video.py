"""SyntheticVideoReID: tracklets of SyntheticReID's people, written in the DukeMTMC-VideoReID layout.

Each tracklet is one rendering of an identity seen by a camera (:func:`.render.render_image`),
followed through its frames with a gentle drift: the person slides sideways and the view
zooms in or out a little, frame by frame, with fresh pixel noise per frame. Files:
``{train,query,gallery}/<pid 4>/<tracklet 4>/<pid 4>_C<camera>_F<frame 4>_X<tracklet 5>.jpg``.
Test ids have one query tracklet (their first camera) and one gallery tracklet per other camera.
"""

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np
from PIL import Image

from .generator import GENERATOR_VERSION, MARKER, SyntheticSpec, SyntheticWorld
from .render import render_image

__all__ = ["VideoSpec", "VIDEO_SPEC", "TINY_VIDEO_SPEC", "PlannedTracklet", "plan_tracklets",
           "generate_synthetic_video"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VideoSpec:
    """The settings of the video variant.

    Args:
        people: the identities, cameras and rendering settings (distractors are not used).
        frames_per_tracklet: (min, max) frames of a tracklet.
        max_zoom: the largest zoom of a frame (1 + max_zoom times the first view).
        max_shift: the largest sideways drift over a tracklet, as a fraction of the width.
    """

    people: SyntheticSpec = field(default_factory=lambda: SyntheticSpec(
        num_train_ids=60, num_test_ids=60, num_cameras=4, cams_per_id=(2, 3), num_distractors=0,
        palette_size=16, occlusion_prob=0.0))
    frames_per_tracklet: Tuple[int, int] = (8, 12)
    max_zoom: float = 0.12
    max_shift: float = 0.08


VIDEO_SPEC = VideoSpec()
TINY_VIDEO_SPEC = VideoSpec(
    people=SyntheticSpec(num_train_ids=8, num_test_ids=6, num_cameras=3, cams_per_id=(2, 2), num_distractors=0,
                         palette_size=6, occlusion_prob=0.0),
    frames_per_tracklet=(3, 5))


@dataclass(frozen=True)
class PlannedTracklet:
    """One tracklet to write: who, which camera, which split, how many frames."""

    split: str
    pid: int
    identity: int
    camera: int  # 0-based
    tracklet: int  # unique over the set
    num_frames: int

    def frame_path(self, frame: int) -> str:
        """The path of frame ``frame`` (0-based) relative to the dataset folder."""
        name = f"{self.pid:04d}_C{self.camera + 1}_F{frame + 1:04d}_X{self.tracklet:05d}.jpg"
        return os.path.join(self.split, f"{self.pid:04d}", f"{self.tracklet:04d}", name)


def plan_tracklets(spec: VideoSpec) -> List[PlannedTracklet]:
    """Every tracklet of the set: one per (identity, camera that sees it); deterministic."""
    people = spec.people
    rng = np.random.default_rng([people.seed, 8])
    plan: List[PlannedTracklet] = []
    for pid in range(1, people.num_train_ids + people.num_test_ids + 1):
        n_cams = int(rng.integers(people.cams_per_id[0], people.cams_per_id[1] + 1))
        cams = sorted(int(c) for c in rng.choice(people.num_cameras, n_cams, replace=False))
        for k, cam in enumerate(cams):
            split = "train" if pid <= people.num_train_ids else ("query" if k == 0 else "gallery")
            frames = int(rng.integers(spec.frames_per_tracklet[0], spec.frames_per_tracklet[1] + 1))
            plan.append(PlannedTracklet(split, pid, pid - 1, cam, len(plan) + 1, frames))
    return plan


def _drifting_frames(base: Image.Image, num_frames: int, spec: VideoSpec, rng: np.random.Generator,
                     noise: float) -> List[Image.Image]:
    """The frames of a tracklet: ``base`` seen through a slowly moving, slowly zooming window."""
    width, height = base.size
    zoom = 1.0 + spec.max_zoom * rng.uniform(0.0, 1.0, size=2)  # zoom at the first and the last frame
    shift = spec.max_shift * width * rng.uniform(-0.5, 0.5, size=2)
    frames = []
    for t in range(num_frames):
        a = t / max(num_frames - 1, 1)
        z, dx = zoom[0] + a * (zoom[1] - zoom[0]), shift[0] + a * (shift[1] - shift[0])
        w, h = width / z, height / z
        left = min(max((width - w) / 2 + dx, 0.0), width - w)
        view = base.resize((width, height), Image.BILINEAR, box=(left, (height - h) / 2, left + w, (height + h) / 2))
        arr = np.asarray(view, dtype=np.float32)
        arr = arr + rng.normal(0.0, noise, size=arr.shape).astype(np.float32)
        frames.append(Image.fromarray(np.clip(arr + 0.5, 0, 255).astype(np.uint8)))
    return frames


def generate_synthetic_video(out_dir: str, spec: VideoSpec = VIDEO_SPEC) -> Dict:
    """Write the video set into ``out_dir``, the marker file last (use via ``ensure_synthetic_reid``).

    Args:
        out_dir: the folder to write into.
        spec: the settings.
    Returns:
        The marker content: generator version, spec and tracklet / frame counts per split.
    """
    start = time.perf_counter()
    people = spec.people
    world = SyntheticWorld(people)  # its identities and cameras; its image plan is not used
    plan = plan_tracklets(spec)
    logger.info("Generating SyntheticVideoReID (%d tracklets, %d frames) in %s ...", len(plan),
                sum(p.num_frames for p in plan), out_dir)
    for item in plan:
        rng = np.random.default_rng([people.seed, 7, item.identity, item.camera])
        base = render_image(world.identities[item.identity], world.cameras[item.camera], rng,
                            people.occlusion_prob, 0.0, people.blur)
        for t, frame in enumerate(_drifting_frames(base, item.num_frames, spec, rng, people.noise)):
            path = os.path.join(out_dir, item.frame_path(t))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            frame.save(path, quality=people.jpeg_quality)
    counts = {split: {"ids": len({p.pid for p in plan if p.split == split}),
                      "tracklets": sum(p.split == split for p in plan),
                      "frames": sum(p.num_frames for p in plan if p.split == split)}
              for split in ("train", "query", "gallery")}
    info = {"generator_version": GENERATOR_VERSION, "spec": dataclasses.asdict(spec), "counts": counts}
    with open(os.path.join(out_dir, MARKER), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    logger.info("SyntheticVideoReID written in %.1f s", time.perf_counter() - start)
    return info
