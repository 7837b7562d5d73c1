#!/usr/bin/env python
"""Benchmark what decoding JPEGs at full size costs the test pipeline, against Pillow's draft mode.

The test pipeline (evaluation, reid-extract, int8 calibration) decodes every image at full size, as
a deployed model's client does; draft mode (JPEG DCT scaling while decoding) is faster on images at
least twice the input size but gives other pixels. Measured on generated pedestrian-like JPEGs at
1x, 2x, 4x and 8x the input size, in interleaved rounds (a pass over the images each):

- ``full``: ``read_image(path)`` + the test transforms (bicubic resize);
- ``draft``: ``read_image(path, draft_size)`` + the same transforms;
- with ``--forward-depth``, the model's forward per image at batch 32 on the CPU, to read the
  decode figures as a share of an evaluation.

Prints medians (ms per image), the full / draft ratio and the largest pixel difference.
"""

import argparse
import os
import statistics
import tempfile
from typing import Dict, List

import numpy as np
import torch
from harness import bot_config, interleaved, random_batch, timed
from PIL import Image, ImageDraw, ImageFilter

from reid_engine.data import build_transforms, read_image


def pedestrian_like(rng: np.random.Generator, height: int, width: int) -> Image.Image:
    """A height x width crop: a textured background, a body of color blocks, blur and sensor noise."""
    img = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(40, 200, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(12):  # background clutter: JPEG costs depend on the content
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        draw.rectangle([x, y, x + width // 6, y + height // 10], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    cx, unit = width // 2, height / 128
    draw.ellipse([cx - 7 * unit, 8 * unit, cx + 7 * unit, 24 * unit], fill=tuple(int(v) for v in rng.integers(90, 230, 3)))
    draw.rectangle([cx - 14 * unit, 24 * unit, cx + 14 * unit, 70 * unit], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    draw.rectangle([cx - 12 * unit, 70 * unit, cx + 12 * unit, 120 * unit], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    img = img.filter(ImageFilter.GaussianBlur(unit))
    noisy = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, (height, width, 3))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8))


def write_images(folder: str, size, scales: List[int], count: int) -> Dict[int, List[str]]:
    """``count`` JPEGs (quality 90) per scale, of scale x ``size`` (height, width)."""
    rng = np.random.default_rng(0)
    paths = {scale: [os.path.join(folder, f"x{scale}_{i}.jpg") for i in range(count)] for scale in scales}
    for scale, files in paths.items():
        for path in files:
            pedestrian_like(rng, size[0] * scale, size[1] * scale).save(path, quality=90)
    return paths


def time_ways(paths: List[str], pipeline, draft_size, rounds: int) -> Dict[str, float]:
    """Median ms per image of the full and the draft decode (+ transforms), in interleaved passes."""
    ways = {"full": lambda: [pipeline(read_image(p)) for p in paths],
            "draft": lambda: [pipeline(read_image(p, draft_size)) for p in paths]}
    totals = interleaved(ways, rounds, warmup=1)  # warm-up: file cache, Pillow's first calls
    return {name: 1000.0 * statistics.median(values) / len(paths) for name, values in totals.items()}


def pixel_difference(paths: List[str], pipeline, draft_size) -> int:
    """The largest |full - draft| of the pipeline outputs over ``paths`` (0..255)."""
    worst = 0
    for path in paths:
        full, draft = pipeline(read_image(path)), pipeline(read_image(path, draft_size))
        worst = max(worst, int((full.int() - draft.int()).abs().max()))
    return worst


def forward_ms(depth: str, size, batch: int = 32, repeats: int = 3) -> float:
    """Median ms per image of a BoT ResNet-``depth`` forward (random weights, fp32, CPU) at ``batch``."""
    from reid_engine.modeling import build_model

    model = build_model(bot_config(depth)).eval()
    images = random_batch(batch, 1, *size)["images"].float()
    with torch.no_grad():
        times, _ = timed(lambda: model({"images": images}), repeats, warmup=1)
    return 1000.0 * statistics.median(times) / batch


def main(argv=None) -> Dict[int, Dict[str, float]]:
    """Run the benchmark and print a table; returns {scale: {"full", "draft", "ratio", "max_diff"}}."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, nargs=2, default=[256, 128], metavar=("H", "W"), help="input size")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 2, 4, 8], help="image size / input size")
    parser.add_argument("--images", type=int, default=40, help="JPEGs per scale")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians are printed)")
    parser.add_argument("--forward-depth", default="", help="also time a ResNet of this depth (e.g. 50x, 18x)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the forward timing")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pipeline = build_transforms(bot_config(size=args.size), is_train=False)
    draft_size = (args.size[1], args.size[0])  # what the pipelines passed to read_image before
    results: Dict[int, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        paths = write_images(folder, args.size, args.scales, args.images)
        print(f"Test pipeline to {args.size[0]}x{args.size[1]}: ms per image, medians of {args.rounds} "
              f"interleaved rounds over {args.images} JPEGs per scale (quality 90)")
        print("| image size | full decode + resize | draft decode + resize | full / draft | max pixel diff |")
        print("|---|---|---|---|---|")
        for scale in args.scales:
            ms = time_ways(paths[scale], pipeline, draft_size, args.rounds)
            diff = pixel_difference(paths[scale], pipeline, draft_size)
            results[scale] = {**ms, "ratio": ms["full"] / ms["draft"], "max_diff": diff}
            print(f"| {scale}x ({args.size[0] * scale}x{args.size[1] * scale}) | {ms['full']:.2f} | "
                  f"{ms['draft']:.2f} | {ms['full'] / ms['draft']:.2f}x | {diff} |")
    if args.forward_depth:
        fwd = forward_ms(args.forward_depth, args.size)
        print(f"ResNet-{args.forward_depth} forward, batch 32, {args.threads} thread(s): {fwd:.2f} ms per image; "
              "full decode + resize as a share of decode + resize + forward:")
        for scale, row in results.items():
            print(f"  {scale}x: full {row['full'] / (row['full'] + fwd):.1%}, draft {row['draft'] / (row['draft'] + fwd):.1%}; "
                  f"evaluation time full / draft {(row['full'] + fwd) / (row['draft'] + fwd):.3f}x")
            row["forward"] = fwd
    return results


if __name__ == "__main__":
    main()
