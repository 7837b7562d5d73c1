"""Writing the SyntheticReID benchmark: its settings, the split plan, atomic creation.

The benchmark is a Market-1501-layout folder (``bounding_box_train/``, ``query/``,
``bounding_box_test/``; names ``PPPP_cCs1_FFFFFF_00.jpg``). Everything derives from
:class:`SyntheticSpec` and its seed: the same spec writes byte-identical files.
"""

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

from ..errors import DatasetFormatError
from .appearance import (
    CLOTH_PALETTES,
    SCENE_PALETTES,
    Camera,
    Identity,
    make_camera,
    make_identity,
    make_outfit_table,
)
from .render import render_image

__all__ = [
    "GENERATOR_VERSION", "MARKER", "SPLIT_DIRS", "SyntheticSpec", "DEFAULT_SPEC", "TINY_SPEC",
    "SHIFTED_SPEC", "SHIFTED_TINY_SPEC",
    "PlannedImage", "SyntheticWorld", "generate_synthetic_reid", "ensure_synthetic_reid", "read_marker",
]

logger = logging.getLogger(__name__)

GENERATOR_VERSION = 1
MARKER = ".complete"  # written last inside the folder; its presence means "fully written"
SPLIT_DIRS = {"train": "bounding_box_train", "query": "query", "gallery": "bounding_box_test"}
PROGRESS_SECONDS = 5.0  # between generation progress lines


@dataclass(frozen=True)
class SyntheticSpec:
    """Every setting of the generator; the defaults (the built-in benchmark) live here only.

    Args:
        num_train_ids, num_test_ids: identities in the training / test split.
        num_cameras: cameras (each with its own scene, lighting and color cast).
        cams_per_id: (min, max) cameras that see one identity (min >= 2).
        images_per_cam: (min, max) images of an identity per camera that sees it.
        num_distractors: gallery images (pid 0) of people outside both splits.
        palette_size: (upper, lower) clothing-color pairs shared by all identities; small
            values make many identities wear the same colors.
        occlusion_prob: probability of a partial occluder per image.
        noise: largest standard deviation of the pixel noise (0..255).
        cast_strength: largest per-channel deviation of a camera's color cast.
        blur: largest per-image blur radius (pixels) on top of the camera's.
        seed: the seed everything derives from.
        jpeg_quality: JPEG quality of the written files.
        cloth_palette: the clothing colors, a key of ``appearance.CLOTH_PALETTES`` ("street" or
            "shifted").
        scene_palette: the background colors, a key of ``appearance.SCENE_PALETTES``.
        brightness: (min, max) of a camera's brightness factor (lighting).
        cast_bias: (R, G, B) offset added to every camera's color cast (the light type
            of the whole network).
        front_prob: (min, max) of a camera's probability that people face it (viewpoint).
        camera_scale: (min, max) of a camera's person-size factor (its distance).

    The defaults of the last six fields are SyntheticReID's; a spec that keeps them
    writes the same files as before those fields existed.
    """

    num_train_ids: int = 300
    num_test_ids: int = 300
    num_cameras: int = 6
    cams_per_id: Tuple[int, int] = (2, 5)
    images_per_cam: Tuple[int, int] = (2, 5)
    num_distractors: int = 100
    palette_size: int = 24
    occlusion_prob: float = 0.15
    noise: float = 6.0
    cast_strength: float = 0.15
    blur: float = 1.0
    seed: int = 0
    jpeg_quality: int = 90
    cloth_palette: str = "street"
    scene_palette: str = "street"
    brightness: Tuple[float, float] = (0.7, 1.15)
    cast_bias: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    front_prob: Tuple[float, float] = (0.25, 0.75)
    camera_scale: Tuple[float, float] = (0.9, 1.05)

    def validate(self) -> None:
        """Raise ``ValueError`` (one line) when the settings cannot make a valid benchmark."""
        lo, hi = self.cams_per_id
        if not 2 <= lo <= hi <= self.num_cameras:
            raise ValueError(f"SyntheticSpec: cams_per_id {self.cams_per_id} must satisfy "
                             f"2 <= min <= max <= num_cameras ({self.num_cameras})")
        if not 1 <= self.images_per_cam[0] <= self.images_per_cam[1]:
            raise ValueError(f"SyntheticSpec: images_per_cam {self.images_per_cam} must satisfy "
                             f"1 <= min <= max")
        if self.num_train_ids < 1 or self.num_test_ids < 1 or self.palette_size < 1:
            raise ValueError("SyntheticSpec: num_train_ids, num_test_ids and palette_size must "
                             "be >= 1")
        if self.num_train_ids + self.num_test_ids > 9999:
            raise ValueError("SyntheticSpec: at most 9,999 identities fit the 4-digit file names")
        if self.cloth_palette not in CLOTH_PALETTES or self.scene_palette not in SCENE_PALETTES:
            raise ValueError(f"SyntheticSpec: cloth_palette / scene_palette must be one of "
                             f"{sorted(CLOTH_PALETTES)}, got {self.cloth_palette!r} / {self.scene_palette!r}")
        for name in ("brightness", "front_prob", "camera_scale"):
            lo, hi = getattr(self, name)
            if not 0.0 <= lo <= hi:
                raise ValueError(f"SyntheticSpec: {name} {getattr(self, name)} must satisfy 0 <= min <= max")


DEFAULT_SPEC = SyntheticSpec()
TINY_SPEC = SyntheticSpec(num_train_ids=24, num_test_ids=16, num_cameras=3, cams_per_id=(2, 3),
                          images_per_cam=(2, 3), num_distractors=10, palette_size=6)
# SyntheticReIDShifted: another camera network in another city. Its own seed draws other
# people (SyntheticReID's identities never appear), dressed from another palette, seen by
# 8 cameras (instead of 6) in darker, greener scenes under warm light, mostly from the
# front and from further away.
SHIFTED_SPEC = SyntheticSpec(num_cameras=8, cams_per_id=(2, 5), seed=26, cloth_palette="shifted",
                             scene_palette="shifted", brightness=(0.55, 0.9), cast_bias=(0.12, 0.03, -0.15),
                             front_prob=(0.6, 0.95), camera_scale=(0.8, 0.95))
SHIFTED_TINY_SPEC = dataclasses.replace(SHIFTED_SPEC, num_train_ids=24, num_test_ids=16, num_cameras=4,
                                        cams_per_id=(2, 3), images_per_cam=(2, 3), num_distractors=10,
                                        palette_size=6)


@dataclass(frozen=True)
class PlannedImage:
    """One image to write: who (identity index), where (camera), which split and file name."""

    split: str
    pid: int        # the pid in the file name (0 for distractors)
    identity: int   # index into the identity list (distractors have their own)
    camera: int     # 0-based
    frame: int      # per-camera frame counter (keeps file names unique)

    @property
    def file_name(self) -> str:
        """``PPPP_cCs1_FFFFFF_00.jpg`` (camera 1-based, as in Market-1501)."""
        return f"{self.pid:04d}_c{self.camera + 1}s1_{self.frame:06d}_00.jpg"

    @property
    def rel_path(self) -> str:
        """The path relative to the dataset folder."""
        return os.path.join(SPLIT_DIRS[self.split], self.file_name)


class SyntheticWorld:
    """The identities and cameras of a spec, and the plan of which image goes where.

    Args:
        spec: the generator settings.
    """

    def __init__(self, spec: SyntheticSpec = DEFAULT_SPEC):
        spec.validate()
        self.spec = spec
        outfits = make_outfit_table(np.random.default_rng([spec.seed, 3]), spec.palette_size, spec.cloth_palette)
        n_people = spec.num_train_ids + spec.num_test_ids + spec.num_distractors
        # Identity k (1-based) is pid k for train and test ids; distractors follow.
        self.identities: List[Identity] = [
            make_identity(np.random.default_rng([spec.seed, 2, k]), outfits, spec.cloth_palette)
            for k in range(1, n_people + 1)]
        self.cameras: List[Camera] = [
            make_camera(np.random.default_rng([spec.seed, 4, c]), spec.cast_strength,
                        scene_palette=spec.scene_palette, brightness=spec.brightness, cast_bias=spec.cast_bias,
                        front_prob=spec.front_prob, scale=spec.camera_scale)
            for c in range(spec.num_cameras)]
        self.plan: List[PlannedImage] = self._make_plan()

    def _make_plan(self) -> List[PlannedImage]:
        """Decide every image: cameras and image counts per id, query picks, distractors."""
        spec = self.spec
        rng = np.random.default_rng([spec.seed, 0])
        frames = [0] * spec.num_cameras
        plan: List[PlannedImage] = []

        def add(split: str, pid: int, identity: int, cam: int) -> None:
            frames[cam] += 1
            plan.append(PlannedImage(split, pid, identity, cam, frames[cam]))

        for pid in range(1, spec.num_train_ids + spec.num_test_ids + 1):
            n_cams = int(rng.integers(spec.cams_per_id[0], spec.cams_per_id[1] + 1))
            cams = sorted(int(c) for c in rng.choice(spec.num_cameras, n_cams, replace=False))
            counts = [int(rng.integers(spec.images_per_cam[0], spec.images_per_cam[1] + 1))
                      for _ in cams]
            if pid <= spec.num_train_ids:
                for cam, count in zip(cams, counts):
                    for _ in range(count):
                        add("train", pid, pid - 1, cam)
                continue
            # Query: one image per camera for a subset of the cameras, leaving at least one
            # camera wholly in the gallery so every query has a cross-camera match.
            n_query = int(rng.integers(1, n_cams))
            query_cams = set(int(c) for c in rng.choice(cams, n_query, replace=False))
            for cam, count in zip(cams, counts):
                for k in range(count):
                    add("query" if cam in query_cams and k == 0 else "gallery", pid, pid - 1, cam)
        first = spec.num_train_ids + spec.num_test_ids
        for d in range(spec.num_distractors):
            add("gallery", 0, first + d, int(rng.integers(spec.num_cameras)))
        return plan

    def render(self, item: PlannedImage) -> Image.Image:
        """Render the planned image (deterministic: seeded by the image's identity and frame)."""
        spec = self.spec
        rng = np.random.default_rng([spec.seed, 1, item.identity, item.camera, item.frame])
        return render_image(self.identities[item.identity], self.cameras[item.camera], rng,
                            spec.occlusion_prob, spec.noise, spec.blur)

    def counts(self) -> Dict[str, Dict[str, int]]:
        """``{split: {"ids": n, "images": n}}`` of the plan."""
        out = {}
        for split in SPLIT_DIRS:
            items = [p for p in self.plan if p.split == split]
            out[split] = {"ids": len({p.pid for p in items}), "images": len(items)}
        return out


def generate_synthetic_reid(out_dir: str, spec: SyntheticSpec = DEFAULT_SPEC, label: str = "") -> Dict:
    """Write the benchmark into ``out_dir`` (created if needed); the marker file last.

    Not atomic on its own: use :func:`ensure_synthetic_reid` to create a dataset folder.
    A progress line is logged at most every PROGRESS_SECONDS, and at the end.

    Args:
        out_dir: the folder to write into.
        spec: the generator settings.
        label: what the progress lines call the job (default: "SyntheticReID in <out_dir>").
    Returns:
        The marker content: generator version, spec and counts.
    """
    start = time.perf_counter()
    world = SyntheticWorld(spec)
    for sub in SPLIT_DIRS.values():
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    total = len(world.plan)
    label = label or f"SyntheticReID in {out_dir}"
    logger.info("Generating %s: %s images (seconds to minutes, once) ...", label, f"{total:,}")
    last_report = start
    for n, item in enumerate(world.plan, 1):
        world.render(item).save(os.path.join(out_dir, item.rel_path), quality=spec.jpeg_quality)
        now = time.perf_counter()
        if n == total or now - last_report >= PROGRESS_SECONDS:
            last_report = now
            eta = (now - start) / n * (total - n)
            logger.info("Generating %s: %s / %s images (%.1f s, ETA %.0f s)", label, f"{n:,}", f"{total:,}",
                        now - start, eta)
    info = {"generator_version": GENERATOR_VERSION, "spec": dataclasses.asdict(spec),
            "counts": world.counts()}
    with open(os.path.join(out_dir, MARKER), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    return info


def ensure_synthetic_reid(root: str, folder: str = "SyntheticReID",
                          spec: SyntheticSpec = DEFAULT_SPEC, force: bool = False,
                          generate=None) -> str:
    """Return ``<root>/<folder>``, generating it first if it is not complete yet.

    Generation writes into a temporary sibling folder and renames it into place, so a
    reader never sees a half-written set; if another process finishes first, ours is
    discarded.

    Args:
        root: the data root.
        folder: the dataset folder name under the root.
        spec: the generator settings used when generating.
        force: replace an existing complete folder (used by ``tools/make_synthetic.py``).
        generate: ``generate(out_dir, spec)`` writing the folder and its marker (default
            :func:`generate_synthetic_reid`; the video variant passes its own).
    Returns:
        The dataset folder path.
    Raises:
        DatasetFormatError: the folder exists without its completion marker (and not ``force``).
        OSError: the data root is not writable (one line naming the fix).
    """
    final = os.path.join(root, folder)
    marker = os.path.join(final, MARKER)
    if os.path.isfile(marker) and not force:
        return final
    if os.path.exists(final) and not os.path.isfile(marker) and not force:
        raise DatasetFormatError(
            f"'{final}' exists but has no '{MARKER}' marker (an interrupted or foreign copy); "
            f"delete it and SyntheticReID will be regenerated")
    try:
        os.makedirs(root, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{folder}.tmp-", dir=root)
    except OSError as e:
        raise OSError(
            f"cannot write {folder} under the data root '{root}' ({e.strerror}); set "
            f"DATASETS.ROOT (or $REID_DATASETS) to a writable folder") from None
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the dataset should be readable
        if generate is None:
            generate_synthetic_reid(tmp, spec, label=f"{folder} under {root}")
        else:
            generate(tmp, spec)
        if force and os.path.isdir(final):
            old = tempfile.mkdtemp(prefix=f".{folder}.old-", dir=root)
            os.rename(final, os.path.join(old, folder))
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isfile(marker):
                raise
            logger.info("%s was completed by another process meanwhile; discarding ours", final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def read_marker(dataset_dir: str) -> Optional[Dict]:
    """Return the marker content of a generated folder, or None when it has none."""
    path = os.path.join(dataset_dir, MARKER)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)
