#!/usr/bin/env python
"""Benchmark the training loader: JPEG decode + augmentations, per image or batched on the device,
with and without the decoded-image cache (DATALOADER.CACHE_IMAGES).

By default it writes Market-1501-style JPEGs (128x64 and 128x48) into a temporary data root and
uses the BoT input recipe at 256x128; ``--config`` takes a config file's inputs and data set
(with ``--data-root``). It measures, in interleaved rounds (medians and their ratios):

1. the per-sample pipeline (read_image + transforms) in this process, per stage, for both
   placements of flip / pad-crop / random erasing (INPUT.DEVICE_AUGMENT off: per image; on: the
   workers decode and resize, :class:`BatchAugmentation` applies them to the batch on ``--device``);
2. ``build_reid_train_loader`` with each --workers count, both placements and each ``--cache``
   setting (the batched placement includes the batch ops, as the trainer runs them; the cache fills
   when the loader is built, before the timed batches: its fill time is printed apart).

Images per second against wall time (the machine's load) and against the decoding processes' CPU
time (the pipeline's cost). The target is at least 1,000 images/s per worker process.
"""

import argparse
import contextlib
import logging
import os
import tempfile
from typing import Dict, List

import numpy as np
import psutil
import torch
from bench_decode import pedestrian_like
from harness import Stopwatch, in_rounds, medians, synchronize, timed

from reid_engine.config import get_cfg
from reid_engine.data import build_batch_augmentation, build_reid_train_loader, build_transforms, read_image
from reid_engine.data.common import sample_rng

TARGET_PER_WORKER = 1000.0


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
            pedestrian_like(rng, 128, width).save(os.path.join(folder, name), quality=90)


def bot_config(root: str):
    """The BoT training input recipe: 256x128, flip, pad 10 + crop, random erasing; 16 x 4."""
    cfg = get_cfg()
    cfg.merge_from_list(["DATASETS.ROOT", root, "DATASETS.NAMES", ("Market1501",), "INPUT.SIZE_TRAIN", [256, 128],
                         "INPUT.FLIP.ENABLED", True, "INPUT.PADDING.ENABLED", True, "INPUT.PADDING.SIZE", 10,
                         "INPUT.REA.ENABLED", True, "DATALOADER.SAMPLER_TRAIN", "NaiveIdentitySampler",
                         "DATALOADER.NUM_INSTANCE", 4, "SOLVER.IMS_PER_BATCH", 64, "SEED", 0])
    return cfg


def with_placement(cfg, workers: int, batched: bool, device: str = "cpu", cache: str = "off"):
    """A copy of ``cfg``: ``workers`` loader workers, the three ops per image or batched, CACHE_IMAGES ``cache``."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(["DATALOADER.NUM_WORKERS", workers, "DATALOADER.CACHE_IMAGES", cache,
                         "INPUT.DEVICE_AUGMENT", "on" if batched else "off", "MODEL.DEVICE", device])
    return cfg


def _train_paths(cfg, count: int) -> List[str]:
    """``count`` training image paths of the config's data set (repeated when it has fewer)."""
    paths = [item[0] for item in build_reid_train_loader(with_placement(cfg, 0, False)).dataset.items]
    return (paths * (count // len(paths) + 1))[:count]


def _rate(fn, count: int, step: int = 1):
    """(images/s wall, images/s CPU) of ``fn(i)`` for i in range(0, count, step), ``step`` images a call."""
    with Stopwatch() as watch:
        for i in range(0, count, step):
            fn(i)
    return count / watch.wall, count / watch.cpu


def bench_pipeline(cfg, count: int, device: str, rounds: int = 1) -> Dict[str, tuple]:
    """``{stage: (median images/s wall, images/s CPU)}`` of read_image and the transforms here, in rounds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a loader worker
    per_image = build_transforms(with_placement(cfg, 0, False), is_train=True)
    workers_only = build_transforms(with_placement(cfg, 0, True), is_train=True)
    paths = _train_paths(cfg, count)
    decoded = [read_image(p, per_image.decode_size) for p in paths[:200]]
    stages = (
        ("decode only", lambda i: read_image(paths[i], per_image.decode_size)),
        ("augment only, per image", lambda i: per_image(decoded[i % len(decoded)], sample_rng(0, 0, i))),
        ("augment only, batched", lambda i: workers_only(decoded[i % len(decoded)], sample_rng(0, 0, i))),
        ("decode + augment, per image", lambda i: per_image(read_image(paths[i], per_image.decode_size),
                                                           sample_rng(0, 0, i))),
        ("decode + augment, batched", lambda i: workers_only(read_image(paths[i], workers_only.decode_size),
                                                            sample_rng(0, 0, i))))
    if per_image.prefix_size() is not None:  # what a worker does with DATALOADER.CACHE_IMAGES
        cached = [per_image.prefix(img) for img in decoded]
        stages += (("cached image + augment, per image",
                    lambda i: per_image(cached[i % len(cached)], sample_rng(0, 0, i), from_prefix=True)),)
    samples = in_rounds({name: lambda fn=fn: _rate(fn, count) for name, fn in stages}, rounds)
    results = {name: medians(rates) for name, rates in samples.items()}
    torch.set_num_threads(threads)  # the batch ops run in the main process, with its threads
    augment = build_batch_augmentation(with_placement(cfg, 0, True, device), device, seed=0)
    if augment is not None:
        batch_size = cfg.SOLVER.IMS_PER_BATCH
        batch = torch.stack([workers_only(img, sample_rng(0, 0, i)) for i, img in enumerate(decoded)])
        batch = batch[torch.arange(batch_size) % len(batch)].to(device)
        augment.apply(batch)  # warm-up

        def batch_ops(_):
            augment.apply(batch)
            synchronize(batch.device)
        rates = [_rate(batch_ops, count - count % batch_size, batch_size) for _ in range(rounds)]
        results[f"batch ops on {device} (main process)"] = medians(rates)
    return results


def _children_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by the live child processes of this process."""
    total = 0.0
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):  # a child that ended meanwhile
            total += sum(child.cpu_times()[:2])
    return total


def bench_loader(cfg, batches: int, device: str) -> Dict[str, float]:
    """Throughput of ``batches`` batches after a warm-up, the batch ops applied as the trainer does."""
    with Stopwatch() as build:
        loader = build_reid_train_loader(cfg)
    workers = cfg.DATALOADER.NUM_WORKERS
    augment = build_batch_augmentation(cfg, device, seed=0)
    iterator = iter(loader)
    for _ in range(3):  # start-up: worker spawn and the first prefetches
        next(iterator)
    child_cpu = _children_cpu_seconds()
    images, augment_seconds = 0, 0.0
    with Stopwatch() as watch:
        for _ in range(batches):
            batch = next(iterator)
            if augment is not None:
                (seconds,), batch = timed(lambda: augment(batch), device=torch.device(device))
                augment_seconds += seconds
            images += len(batch["targets"])
    decode_cpu = (_children_cpu_seconds() - child_cpu) if workers else watch.cpu
    loader.close()
    return {"images/s": images / watch.wall, "images/s per worker": images / watch.wall / max(workers, 1),
            "images per worker CPU-s": images / decode_cpu if decode_cpu > 0 else float("nan"),
            "batch ops ms/batch": 1000 * augment_seconds / batches, "build s": build.wall}


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="", help="take inputs, batch and data set from this config file "
                        "(default: the BoT recipe at 256x128 on written Market-like JPEGs)")
    parser.add_argument("--data-root", default="datasets", help="DATASETS.ROOT with --config")
    parser.add_argument("--device", default="cpu", help="where the batched ops run (cpu, cuda)")
    parser.add_argument("--images", type=int, default=3000, help="training images to write")
    parser.add_argument("--ids", type=int, default=300, help="identities")
    parser.add_argument("--batches", type=int, default=40, help="timed batches per loader run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every loader variant")
    parser.add_argument("--workers", type=int, nargs="+",
                        default=sorted({0, 1, 2, os.cpu_count() or 1}),
                        help="loader worker counts to measure")
    parser.add_argument("--cache", nargs="+", default=["off", "on"], choices=["off", "on"],
                        help="DATALOADER.CACHE_IMAGES settings to measure")
    parser.add_argument("--keep", default="", help="write the images here and keep them")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="bench_loader_") as tmp:
        if args.config:
            cfg = get_cfg()
            cfg.merge_from_file(args.config)
            cfg.DATASETS.ROOT = args.data_root
            recipe = f"{args.config}: {cfg.INPUT.SIZE_TRAIN[0]}x{cfg.INPUT.SIZE_TRAIN[1]}"
        else:
            root = args.keep or tmp
            if not os.path.isdir(os.path.join(root, "Market-1501-v15.09.15")):
                print(f"writing {args.images} JPEGs (128x64 / 128x48) under {root} ...", flush=True)
                write_market_like(root, args.images, args.ids)
            cfg = bot_config(root)
            recipe = "BoT: resize 256x128 bicubic"
        moved = ", ".join(name for name, on in (("pad-crop", cfg.INPUT.PADDING.ENABLED), ("flip", cfg.INPUT.FLIP.ENABLED),
                                                ("erasing", cfg.INPUT.REA.ENABLED)) if on)
        print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}")
        print(f"\nper-sample pipeline in one process ({recipe}; batched: {moved} on {args.device})")
        for name, (wall, cpu) in bench_pipeline(cfg, min(args.images, 1000), args.device, args.rounds).items():
            print(f"  {name:36s} {wall:8.0f} images/s wall   {cpu:8.0f} images/CPU-s")
        print(f"\ntrain loader, batches of {cfg.SOLVER.IMS_PER_BATCH}, {args.batches} timed batches, "
              f"{args.rounds} interleaved rounds (medians)")
        runs = in_rounds({(workers, cache, batched): lambda key=(workers, cache, batched): bench_loader(
            with_placement(cfg, key[0], key[2], args.device, key[1]), args.batches, args.device)
            for workers in args.workers for cache in args.cache for batched in (False, True)}, args.rounds)
        print(f"  {'workers':>7s} {'cache':>5s} {'placement':>10s} {'images/s':>10s} {'per worker':>11s} "
              f"{'per worker CPU-s':>17s} {'vs 1000/worker':>15s} {'batch ops ms':>13s} {'build s':>8s} "
              f"{'batched/per image':>18s} {'cached/decoded':>15s}")
        for (workers, cache, batched), results in runs.items():
            median = medians(results)
            rate = median["images per worker CPU-s"]
            others = ((workers, cache, False) if batched else None, (workers, "off", batched) if cache == "on" else None)
            ratios = [f"{median['images/s'] / medians(runs[other])['images/s']:.2f}x" if other in runs else ""
                      for other in others]
            print(f"  {workers:7d} {cache:>5s} {'batched' if batched else 'per image':>10s} {median['images/s']:10.0f} "
                  f"{median['images/s per worker']:11.0f} {rate:17.0f} {rate / TARGET_PER_WORKER:14.2f}x "
                  f"{median['batch ops ms/batch']:13.1f} {median['build s']:8.1f} {ratios[0]:>18s} {ratios[1]:>15s}",
                  flush=True)


if __name__ == "__main__":
    main()
