"""How hard is SyntheticReID? Retrieval accuracy of color-histogram baselines.

A trained model must reach 80% mAP on SyntheticReID; a color histogram must stay far below, or the
benchmark would only test color matching. Prints mAP / Rank-1 of a global 8x8x8 RGB histogram and
of 6 stripes' histograms, cosine distance, on the image files and on an ideal re-rendering of the
person pixels alone (no background, color cast, blur, noise or occlusion): shared clothing colors
alone. ``python tools/benchmarks/synthetic_difficulty.py --root /tmp/reid_data``
"""

import argparse
import dataclasses
import functools
import logging
import os

import numpy as np
from harness import Stopwatch
from PIL import Image

from reid_engine.data.datasets import SyntheticSpec, SyntheticWorld, get_dataset, resolve_data_root
from reid_engine.data.synthetic import read_marker, render_image
from reid_engine.evaluation import evaluate_rank

logger = logging.getLogger("synthetic_difficulty")


def color_histogram(img: np.ndarray, bins: int, stripes: int, keep=None) -> np.ndarray:
    """L2-normalised RGB histogram (``bins`` per channel) per horizontal stripe, of the ``keep`` pixels (HxW bool) only."""
    img = img.astype(np.int64)
    code = ((img[..., 0] * bins // 256) * bins + img[..., 1] * bins // 256) * bins + img[..., 2] * bins // 256
    keep = np.ones(code.shape, bool) if keep is None else keep
    parts = zip(np.array_split(code, stripes, axis=0), np.array_split(keep, stripes, axis=0))
    hist = np.concatenate([np.bincount(c[k], minlength=bins ** 3) for c, k in parts])
    return (hist / max(np.linalg.norm(hist), 1e-12)).astype(np.float32)


def file_histograms(paths, bins: int, stripes: int) -> np.ndarray:
    """Histograms of the image files (background, color cast and all)."""
    feats = []
    for n, path in enumerate(paths, 1):
        feats.append(color_histogram(np.asarray(Image.open(path).convert("RGB")), bins, stripes))
        if n % 2000 == 0:
            logger.info("  %d / %d images", n, len(paths))
    return np.stack(feats)


def ideal_person_histograms(dataset_dir: str, paths, bins: int, stripes: int) -> np.ndarray:
    """Histograms of the *person pixels only*, each image re-rendered with the same pose and view on a flat
    green background without camera effects: the best a color histogram could do (color sharing alone)."""
    marker = read_marker(dataset_dir)
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in marker["spec"].items()}
    world = SyntheticWorld(SyntheticSpec(**fields))
    by_path = {item.rel_path: item for item in world.plan}
    key = (0, 255, 0)
    feats = []
    for path in paths:
        item = by_path[os.path.relpath(path, dataset_dir)]
        cam = world.cameras[item.camera]
        neutral = dataclasses.replace(cam, background=np.full_like(cam.background, key), gain=(1.0, 1.0, 1.0), haze=0.0, blur=0.0)
        rng = np.random.default_rng([world.spec.seed, 1, item.identity, item.camera, item.frame])
        img = np.asarray(render_image(world.identities[item.identity], neutral, rng, 0.0, 0.0, 0.0)).astype(np.int64)
        person = np.abs(img - np.array(key)).sum(-1) > 60
        feats.append(color_histogram(img, bins, stripes, keep=person))
    return np.stack(feats)


def evaluate(distmat, q, g):
    """Return (mAP, Rank-1) in percent, by ``reid_engine.evaluation.evaluate_rank``."""
    cmc, mAP = evaluate_rank(distmat, np.array([p for _, p, _ in q]), np.array([p for _, p, _ in g]),
                             np.array([c for _, _, c in q]), np.array([c for _, _, c in g]))[:2]
    return 100.0 * float(mAP), 100.0 * float(cmc[0])


def main() -> None:
    """Parse arguments, build the dataset if needed and print the baseline figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="", help="data root (default: $REID_DATASETS or ./datasets)")
    parser.add_argument("--dataset", default="SyntheticReID")
    parser.add_argument("--bins", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ds = get_dataset(args.dataset, resolve_data_root(args.root))
    paths = [p for p, _, _ in ds.query + ds.gallery]
    ideal = functools.partial(ideal_person_histograms, ds.dataset_dir)
    for what, features in (("image files", file_histograms), ("ideal: person pixels, no camera effects", ideal)):
        for stripes in (1, 6):
            with Stopwatch() as watch:
                feats = features(paths, args.bins, stripes)
                qf, gf = feats[:len(ds.query)], feats[len(ds.query):]
                mAP, rank1 = evaluate(1.0 - qf @ gf.T, ds.query, ds.gallery)
            print(f"{args.dataset} {args.bins}x{args.bins}x{args.bins} RGB histogram, {stripes} stripe(s), cosine, {what}: "
                  f"mAP {mAP:.1f}%  Rank-1 {rank1:.1f}%  ({len(ds.query)} q x {len(ds.gallery)} g, {watch.wall:.1f} s, "
                  "metrics: reid_engine.evaluation.evaluate_rank)")


if __name__ == "__main__":
    main()
