#!/usr/bin/env python
"""Benchmark the training loader: JPEG decode + BoT augmentations at 256x128.

Writes a Market-1501-style folder of small JPEGs (128x64 and 128x48, like Market's crops)
into a temporary data root, then measures

1. the per-sample pipeline (read_image + transforms) in this process, per stage;
2. ``build_reid_train_loader`` with 0, 1, ... N loader workers (P x K batches of 64).

Images per second are given against wall time and against CPU time (the CPU seconds the
decoding processes spent), since on a shared machine the wall rate reflects the load of
other processes while the CPU rate is the cost of the pipeline itself. The target is at
least 1,000 images/s per worker process.

Usage:
    python tools/benchmarks/bench_train_loader.py [--images 3000] [--batches 40]
        [--workers 0 1 2] [--keep DIR]
"""

import argparse
import logging
import os
import tempfile
import time
from typing import Dict, List

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from reid_engine.config import get_cfg
from reid_engine.data import build_reid_train_loader, build_transforms, read_image
from reid_engine.data.common import sample_rng

TARGET_PER_WORKER = 1000.0


def _pedestrian_like(rng: np.random.Generator, width: int) -> Image.Image:
    """A 128 x width crop with a background, a body of two color blocks, blur and noise."""
    img = Image.new("RGB", (width, 128), tuple(int(v) for v in rng.integers(40, 200, 3)))
    draw = ImageDraw.Draw(img)
    cx = width // 2 + int(rng.integers(-6, 7))
    draw.ellipse([cx - 7, 8, cx + 7, 24], fill=tuple(int(v) for v in rng.integers(90, 230, 3)))
    draw.rectangle([cx - 14, 24, cx + 14, 70], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    draw.rectangle([cx - 12, 70, cx + 12, 120], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    img = img.filter(ImageFilter.GaussianBlur(1.0))
    noisy = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, (128, width, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def write_market_like(root: str, num_images: int, num_ids: int, seed: int = 0) -> None:
    """Write ``num_images`` training JPEGs (plus a small query / gallery) in Market's layout."""
    rng = np.random.default_rng(seed)
    base = os.path.join(root, "Market-1501-v15.09.15")
    for split, count in (("bounding_box_train", num_images), ("query", 2 * num_ids // 10 + 2),
                         ("bounding_box_test", 4 * num_ids // 10 + 4)):
        folder = os.path.join(base, split)
        os.makedirs(folder, exist_ok=True)
        for i in range(count):
            pid = 1 + (i % num_ids if split == "bounding_box_train" else i % (num_ids // 10 + 1))
            cam = 1 + (i // (num_ids if split == "bounding_box_train" else num_ids // 10 + 1)) % 6
            width = 64 if i % 3 else 48
            name = f"{pid:04d}_c{cam}s1_{i:06d}_01.jpg"
            _pedestrian_like(rng, width).save(os.path.join(folder, name), quality=90)


def bot_config(root: str, workers: int):
    """The BoT training input recipe: 256x128, flip, pad 10 + crop, random erasing; 16 x 4."""
    cfg = get_cfg()
    cfg.DATASETS.ROOT = root
    cfg.DATASETS.NAMES = ("Market1501",)
    cfg.INPUT.SIZE_TRAIN = [256, 128]
    cfg.INPUT.FLIP.ENABLED = True
    cfg.INPUT.PADDING.ENABLED = True
    cfg.INPUT.PADDING.SIZE = 10
    cfg.INPUT.REA.ENABLED = True
    cfg.DATALOADER.SAMPLER_TRAIN = "NaiveIdentitySampler"
    cfg.DATALOADER.NUM_INSTANCE = 4
    cfg.DATALOADER.NUM_WORKERS = workers
    cfg.SOLVER.IMS_PER_BATCH = 64
    cfg.SEED = 0
    return cfg


def bench_pipeline(root: str, count: int) -> Dict[str, float]:
    """Time read_image and each transform stage in this process; return images/s figures."""
    torch.set_num_threads(1)  # as in a loader worker
    pipeline = build_transforms(bot_config(root, 0), is_train=True)
    folder = os.path.join(root, "Market-1501-v15.09.15", "bounding_box_train")
    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    paths = (paths * (count // len(paths) + 1))[:count]
    decoded = [read_image(p, pipeline.decode_size) for p in paths[:200]]
    results = {}
    for name, fn in (
            ("decode only", lambda i: read_image(paths[i], pipeline.decode_size)),
            ("augment only", lambda i: pipeline(decoded[i % len(decoded)], sample_rng(0, 0, i))),
            ("decode + augment", lambda i: pipeline(read_image(paths[i], pipeline.decode_size),
                                                    sample_rng(0, 0, i)))):
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(count):
            fn(i)
        results[name] = (count / (time.perf_counter() - wall), count / (time.process_time() - cpu))
    return results


def _children_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by the live child processes of this process."""
    me, total, tick = os.getpid(), 0.0, os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # fields[1] is the parent pid
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def bench_loader(root: str, workers: int, batches: int) -> Dict[str, float]:
    """Iterate ``batches`` batches after a warm-up batch; return throughput figures."""
    loader = build_reid_train_loader(bot_config(root, workers))
    iterator = iter(loader)
    for _ in range(3):  # start-up: worker spawn and the first prefetches
        next(iterator)
    child_cpu, own_cpu = _children_cpu_seconds(), time.process_time()
    wall = time.perf_counter()
    images = 0
    for _ in range(batches):
        images += len(next(iterator)["targets"])
    wall = time.perf_counter() - wall
    decode_cpu = (_children_cpu_seconds() - child_cpu) if workers else \
        (time.process_time() - own_cpu)
    loader.close()
    return {"images/s": images / wall,
            "images/s per worker": images / wall / max(workers, 1),
            "images per worker CPU-s": images / decode_cpu if decode_cpu > 0 else float("nan")}


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000, help="training images to write")
    parser.add_argument("--ids", type=int, default=300, help="identities")
    parser.add_argument("--batches", type=int, default=40, help="timed batches per loader run")
    parser.add_argument("--workers", type=int, nargs="+",
                        default=sorted({0, 1, 2, os.cpu_count() or 1}),
                        help="loader worker counts to measure")
    parser.add_argument("--keep", default="", help="write the images here and keep them")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="bench_loader_") as tmp:
        root = args.keep or tmp
        if not os.path.isdir(os.path.join(root, "Market-1501-v15.09.15")):
            print(f"writing {args.images} JPEGs (128x64 / 128x48) under {root} ...", flush=True)
            write_market_like(root, args.images, args.ids)
        print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, "
              f"load average {os.getloadavg()[0]:.1f}")
        print("\nper-sample pipeline in one process (BoT: resize 256x128 bicubic, flip, "
              "pad 10 + crop, random erasing)")
        for name, (wall, cpu) in bench_pipeline(root, min(args.images, 2000)).items():
            print(f"  {name:18s} {wall:8.0f} images/s wall   {cpu:8.0f} images/CPU-s")
        print(f"\ntrain loader, batches of 64 (16 ids x 4), {args.batches} timed batches")
        print(f"  {'workers':>7s} {'images/s':>10s} {'per worker':>11s} {'per worker CPU-s':>17s}"
              f" {'vs 1000/worker':>15s}")
        for workers in args.workers:
            r = bench_loader(root, workers, args.batches)
            rate = r["images per worker CPU-s"]
            print(f"  {workers:7d} {r['images/s']:10.0f} {r['images/s per worker']:11.0f} "
                  f"{rate:17.0f} {rate / TARGET_PER_WORKER:14.2f}x", flush=True)


if __name__ == "__main__":
    main()
