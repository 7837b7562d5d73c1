#!/usr/bin/env python
"""Benchmark the model zoo: every backbone as a BoT model, one table.

For each backbone (MODEL.BACKBONE.NAME + DEPTH), the BoT model (BNNeck, CE + hard-mining triplet,
751 classes, no ImageNet weights):
- params of the whole model, and GFLOPs: inference multiply-adds of one 256x128 image (fvcore);
- CPU img/s of inference (eval, no grad) and of SGD training steps, batches of 32 (8 ids x 4);
- with --device cuda, the same on the GPU under AMP (--amp-dtype).
Medians over the timed iterations after the warm-up; rows outside --timed get params and GFLOPs.
``--write docs/MODEL_ZOO.md`` writes the table with how it was made.
"""
import argparse
import datetime
import os
import platform
import statistics
import sys

import torch
from bench_model import time_training_steps
from harness import Stopwatch, bot_config, random_batch, timed

from reid_engine.modeling import META_ARCH_REGISTRY
from reid_engine.modeling.meta_arch import count_flops, count_parameters

# (MODEL.BACKBONE.NAME, [DEPTH, ...]); "+ibn" appended to a depth sets WITH_IBN.
FAMILIES = [
    ("build_resnet_backbone", ["18x", "34x", "50x", "50x+ibn", "101x", "101x+ibn", "152x"]),
    ("build_resnest_backbone", ["50x", "101x", "200x", "269x"]),
    ("build_resnext_backbone", ["50x", "101x", "101x+ibn", "152x"]),
    ("build_osnet_backbone", ["x1_0", "x1_0+ibn", "x0_75", "x0_5", "x0_25", "ain_x1_0", "ain_x0_75",
                              "ain_x0_5", "ain_x0_25"]),
    ("build_mobilenetv2_backbone", ["1.0x", "0.75x", "0.5x", "0.35x", "0.25x", "0.1x"]),
    ("build_mobilenetv3_backbone", ["Large", "Small"]),
    ("build_shufflenetv2_backbone", ["2.0x", "1.5x", "1.0x", "0.5x"]),
    ("build_regnet_backbone", [f"{size}{kind}" for size in (200, 400, 800, 1600, 3200, 4000, 6400)
                               for kind in "xy"]),
    ("build_effnet_backbone", [f"b{i}" for i in range(8)]),
    ("build_vit_backbone", ["small", "base", "large"]),
    ("build_repvgg_backbone", ["A0", "A1", "A2", "B0", "B1", "B1g2", "B1g4", "B2", "B2g2", "B2g4", "B3",
                               "B3g2", "B3g4"]),
]
# Timed by default: the depth each family is usually trained at, and its lightest member.
DEFAULT_TIMED = {
    "resnet-18x", "resnet-50x", "resnet-50x+ibn", "resnest-50x", "resnext-101x+ibn", "osnet-x1_0",
    "osnet-x1_0+ibn", "osnet-x0_25", "osnet-ain_x1_0", "mobilenetv2-1.0x", "mobilenetv3-Large",
    "mobilenetv3-Small", "shufflenetv2-1.0x", "regnet-800y", "regnet-1600x", "effnet-b0", "repvgg-A0",
    "repvgg-B1g2", "vit-small", "vit-base",
}
HEIGHT, WIDTH = 256, 128
NUM_CLASSES = 751


def row_name(builder: str, depth: str) -> str:
    """Short row label, e.g. ("build_osnet_backbone", "x1_0") -> "osnet-x1_0"."""
    return f"{builder[len('build_'):-len('_backbone')]}-{depth}"


def build_bot(builder: str, depth: str, device: str):
    """The BoT model on `builder` / `depth` ("+ibn" sets WITH_IBN), in train mode on `device`."""
    plain_depth, _, variant = depth.partition("+")
    cfg = bot_config(plain_depth, (HEIGHT, WIDTH), device, NUM_CLASSES, backbone=builder)
    cfg.MODEL.BACKBONE.WITH_IBN = variant == "ibn"
    torch.manual_seed(0)
    return META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE).from_config(cfg).to(device)


def inference_images_per_second(model, batch: int, iters: int, warmup: int, amp_dtype=None) -> float:
    """Median images/s of eval-mode inference on random uint8 batches."""
    images = random_batch(batch, 1, HEIGHT, WIDTH, model.device)["images"]
    model.eval()
    with torch.no_grad(), torch.autocast(model.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        times, _ = timed(lambda: model({"images": images}), iters, warmup, model.device)
    model.train()
    return batch / statistics.median(times)


def train_images_per_second(model, batch: int, instances: int, iters: int, warmup: int, amp_dtype=None) -> float:
    """Median images/s of SGD training steps on a random batch of P x `instances` identities."""
    images = random_batch(batch, instances, HEIGHT, WIDTH, model.device)
    return batch / statistics.median(time_training_steps(model, images, iters, warmup, amp_dtype, verbose=False))


def measure(builder: str, depth: str, args, with_speed: bool) -> dict:
    """One row: params, GFLOPs and (`with_speed`) the throughputs."""
    model = build_bot(builder, depth, "cpu")
    row = {"params": count_parameters(model) / 1e6, "gflops": count_flops(model, (HEIGHT, WIDTH)) / 1e9}
    if with_speed:
        row["cpu_infer"] = inference_images_per_second(model, args.batch, args.iters, args.warmup)
        row["cpu_train"] = train_images_per_second(model, args.batch, args.instances, args.iters, args.warmup)
        if args.device == "cuda":
            dtype = getattr(torch, args.amp_dtype)
            model = model.to("cuda")
            row["gpu_infer"] = inference_images_per_second(model, args.gpu_batch, args.gpu_iters, 3, dtype)
            row["gpu_train"] = train_images_per_second(model, args.gpu_batch, args.instances, args.gpu_iters, 3, dtype)
    return row


COLUMNS = [("params", "params (M)", "{:.2f}"), ("gflops", "GFLOPs", "{:.2f}"),
           ("cpu_infer", "CPU infer img/s", "{:.1f}"), ("cpu_train", "CPU train img/s", "{:.1f}"),
           ("gpu_infer", "GPU infer img/s (AMP)", "{:.0f}"), ("gpu_train", "GPU train img/s (AMP)", "{:.0f}")]


def markdown_table(rows: dict, gpu: bool) -> str:
    """The results as a markdown table (untimed cells: "-")."""
    columns = [c for c in COLUMNS if gpu or not c[0].startswith("gpu")]
    lines = ["| backbone (NAME-DEPTH) | " + " | ".join(title for _, title, _ in columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, row in rows.items():
        cells = [fmt.format(row[key]) if key in row else "-" for key, _, fmt in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_markdown(path: str, table: str, args, command: str) -> None:
    """Write docs/MODEL_ZOO.md: how the figures were produced, then the table."""
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else None
    header = f"""# Model zoo

Every backbone that `MODEL.BACKBONE.NAME` / `DEPTH` can build, as a BoT model (BNNeck, CE +
hard-mining triplet, 751 classes, no ImageNet weights). Generated by
`tools/benchmarks/bench_model_zoo.py`; rerun it to refresh this file. All figures in the table
come from this one command:

    {command}

- params: parameters of the whole model (backbone and head).
- GFLOPs: inference multiply-adds for one 256x128 image (fvcore's count).
- CPU infer img/s: eval-mode inference, batches of {args.batch} random 256x128 images,
  {args.threads} CPU threads, median of {args.iters} batches after {args.warmup} warm-up.
- CPU train img/s: full training steps (forward, CE + triplet, backward, SGD) on a batch of
  {args.batch} ({args.batch // args.instances} ids x {args.instances}), median of {args.iters} steps.
""" + (f"""- GPU img/s: {gpu}, autocast {args.amp_dtype}, batch {args.gpu_batch}, median of {args.gpu_iters}.
""" if gpu else """- GPU columns: not measured here (no GPU was lent when this file was generated); run the
  command with `--device cuda` on a CUDA machine to add them.
""") + f"""- "-": not timed in this run (only the default timed set is timed; `--timed all` times all).

Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__},
{datetime.date.today().isoformat()}. Machines of this class differ about 2x in speed from run to run:
compare rows within the table, not with another machine's figures.

"""
    with open(path, "w") as handle:
        handle.write(header + table + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=[], help="families to include (e.g. osnet regnet)")
    parser.add_argument("--timed", nargs="+", default=sorted(DEFAULT_TIMED),
                        help="rows to time ('all' for every row); the others get params and GFLOPs only")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda adds the GPU columns")
    parser.add_argument("--amp-dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--instances", type=int, default=4, help="images per identity (K)")
    parser.add_argument("--iters", type=int, default=3, help="timed CPU batches / steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed CPU batches / steps first")
    parser.add_argument("--gpu-batch", type=int, default=64)
    parser.add_argument("--gpu-iters", type=int, default=20)
    parser.add_argument("--write", default="", metavar="PATH", help="also write the markdown file (docs/MODEL_ZOO.md)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    timed_all = args.timed == ["all"]
    rows = {}
    for builder, depths in FAMILIES:
        if args.only and not any(f"_{family}_" in builder for family in args.only):
            continue
        for depth in depths:
            name = row_name(builder, depth)
            timed_row = timed_all or name in args.timed
            with Stopwatch() as watch:
                rows[name] = measure(builder, depth, args, timed_row)
            print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in rows[name].items()) + f" ({watch.wall:.0f}s)", flush=True)
    table = markdown_table(rows, args.device == "cuda")
    print(f"\n{table}")
    if args.write:
        command = "python tools/benchmarks/bench_model_zoo.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_markdown(args.write, table, args, command.strip())
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
