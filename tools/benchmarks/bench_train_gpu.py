#!/usr/bin/env python
"""Benchmark training throughput: the model-only step, the full trainer loop, the loader alone.

The baseline workload of ReID papers: BoT ResNet-50 (configs/Market1501/bagtricks_R50.yml) from
scratch on SyntheticReID (generated under --data-root on first use). Per variant, images/s and
the peak GPU memory of:
- model: forward, losses, backward and optimizer step on one fixed batch on the device;
- trainer: the real DefaultTrainer loop (loader, prefetcher, hooks, logging, loss staging);
- loader: the training data loader alone (decode, augment, collate), no model.
Variants: fp32, fp16, bf16 (SOLVER.AMP.DTYPE), +cl (MODEL.CHANNELS_LAST on), +compile (MODEL.COMPILE
default), +compile:MODE (any MODEL.COMPILE mode: reduce-overhead = CUDA graphs, max-autotune, ...),
+auto (MODEL.COMPILE auto); else eager. The table names each trainer run's compile mode and auto's
fallback with its reason. Throughput is one window of --iters iterations after --warmup (which
must cover compilation, and auto's 12 guarded first steps), synchronised at its two ends only.

    python tools/benchmarks/bench_train_gpu.py --variants bf16+cl bf16+cl+compile:reduce-overhead \
        bf16+cl+compile:max-autotune bf16+cl+auto --iters 200 --warmup 40
"""
import argparse
import os
import statistics
import tempfile

import torch
from harness import REPO, StepTimer, TrainOnly, interleaved, print_command, print_table, random_batch, train_step

from reid_engine.config import get_cfg
from reid_engine.data import build_reid_train_loader
from reid_engine.engine import DefaultTrainer
from reid_engine.engine.train_loop import resolve_amp_dtype
from reid_engine.runtime.compile import normalize_compile_mode
from reid_engine.runtime.compiled import mark_step_begin
from reid_engine.solver import build_optimizer
from reid_engine.utils.logger import setup_logger

DEFAULT_VARIANTS = ["fp32", "fp16", "bf16", "bf16+cl", "bf16+cl+compile"]


def variant_config(args, variant: str, output_dir: str):
    """The BoT config with the variant's AMP dtype, memory format and compile switches."""
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    parts = variant.split("+")
    cfg.merge_from_list([
        "MODEL.DEVICE", args.device, "MODEL.BACKBONE.DEPTH", args.depth, "MODEL.BACKBONE.PRETRAIN", False,
        "MODEL.CHANNELS_LAST", "on" if "cl" in parts else "off", "MODEL.COMPILE", variant_compile_mode(parts),
        "MODEL.COMPILE_BACKEND", args.compile_backend, "SOLVER.AMP.ENABLED", parts[0] != "fp32",
        "SOLVER.AMP.DTYPE", {"fp16": "float16", "bf16": "bfloat16"}.get(parts[0], "auto"),
        "SOLVER.IMS_PER_BATCH", args.batch, "SOLVER.CHECKPOINT_PERIOD", 10_000, "INPUT.SIZE_TRAIN", list(args.size),
        "INPUT.SIZE_TEST", list(args.size), "DATASETS.NAMES", (args.dataset,), "DATASETS.TESTS", (args.dataset,),
        "DATASETS.ROOT", args.data_root, "DATALOADER.NUM_WORKERS", args.workers, "OUTPUT_DIR", output_dir, "SEED", 0])
    return cfg


def variant_compile_mode(parts) -> str:
    """MODEL.COMPILE of a variant's parts: compile -> default, compile:MODE -> MODE, auto -> auto, else off."""
    modes = [p.split(":", 1)[1] if ":" in p else "default" for p in parts if p.startswith("compile")]
    modes += ["auto" for p in parts if p == "auto"]
    if len(modes) > 1:
        raise SystemExit(f"variant {'+'.join(parts)!r} names more than one compile mode: {modes}")
    return normalize_compile_mode(modes[0]) if modes else "off"


def bench_model_step(cfg, args, num_classes: int) -> tuple:
    """(images/s, peak GB) of the bare training step on one fixed device batch."""
    cfg = cfg.clone()
    cfg.MODEL.HEADS.NUM_CLASSES = num_classes
    model = DefaultTrainer.build_model(cfg)
    device = model.device
    optimizer = build_optimizer(cfg, model)
    dtype = resolve_amp_dtype(cfg.SOLVER.AMP.DTYPE, device.type) if cfg.SOLVER.AMP.ENABLED else None
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    batch = random_batch(args.batch, cfg.DATALOADER.NUM_INSTANCE, *args.size, device)
    # CUDA graphs: mark a new step, as CompileGuard does in the trainer
    step = train_step(model, optimizer, batch, dtype, scaler, before=lambda: mark_step_begin(model))
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    # one window, one synchronisation at each end; the memory peak includes the warm-up steps
    (seconds,) = interleaved({"step": step}, rounds=1, calls=args.iters, warmup=args.warmup, device=device)["step"]
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")
    return args.batch * args.iters / seconds, peak


def compile_outcome(trainer) -> str:
    """The compile mode a trainer ran with, and auto's fallback with its reason."""
    guard = trainer.compile_guard
    if guard.mode == "off":
        return "eager"
    return f"{guard.mode} -> eager ({guard.reason})" if guard.fell_back else guard.mode


def bench_trainer(cfg, args) -> tuple:
    """(images/s, peak GB, number of classes, compile outcome) of the full DefaultTrainer loop."""
    window = StepTimer(start=args.warmup, device=torch.device(args.device))
    trainer = TrainOnly(cfg, args.warmup + args.iters, [window])
    trainer.train()
    num_classes = trainer.cfg.MODEL.HEADS.NUM_CLASSES
    return args.batch * args.iters / window.window, window.peak_gb, num_classes, compile_outcome(trainer)


def bench_loader(cfg, args) -> float:
    """Images/s of the training loader alone."""
    batches = iter(build_reid_train_loader(cfg))
    (seconds,) = interleaved({"loader": lambda: next(batches)}, rounds=1, calls=args.iters, warmup=args.warmup)["loader"]
    return args.batch * args.iters / seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", default=os.path.join(REPO, "configs", "Market1501", "bagtricks_R50.yml"))
    parser.add_argument("--data-root", default=os.path.join(REPO, "datasets"))
    parser.add_argument("--dataset", default="SyntheticReID", help="the training set (generated on first use)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    parser.add_argument("--depth", default="50x")
    parser.add_argument("--size", nargs=2, type=int, default=[256, 128], metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="DATALOADER.NUM_WORKERS")
    parser.add_argument("--iters", type=int, default=100, help="timed iterations")
    parser.add_argument("--warmup", type=int, default=20, help="untimed iterations first")
    parser.add_argument("--skip-loader", action="store_true")
    parser.add_argument("--compile-backend", default="inductor", help="MODEL.COMPILE_BACKEND of the compile variants")
    args = parser.parse_args(argv)
    setup_logger()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"torch {torch.__version__}, {name}, BoT R{args.depth[:-1]} {args.size[0]}x{args.size[1]}, "
          f"batch {args.batch}, {args.workers} loader workers, {args.iters} timed iterations after {args.warmup}")
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for variant in args.variants:
            cfg = variant_config(args, variant, os.path.join(out, variant))
            trainer_ips, trainer_gb, num_classes, compiled = bench_trainer(cfg, args)
            model_ips, model_gb = bench_model_step(cfg, args, num_classes)
            rows.append((variant, model_ips, model_gb, trainer_ips, trainer_gb, compiled))
            print(f"{variant}: model {model_ips:.0f} img/s ({model_gb:.2f} GB), "
                  f"trainer {trainer_ips:.0f} img/s ({trainer_gb:.2f} GB), compile: {compiled}", flush=True)
        loader_ips = None if args.skip_loader else bench_loader(variant_config(args, "fp32", out), args)
    print()
    print_table(("variant", "model-only img/s", "peak GB", "trainer loop img/s", "peak GB", "trainer / model", "compile"),
                ((variant, f"{model_ips:.0f}", f"{model_gb:.2f}", f"{trainer_ips:.0f}", f"{trainer_gb:.2f}",
                  f"{trainer_ips / model_ips:.2f}", compiled)
                 for variant, model_ips, model_gb, trainer_ips, trainer_gb, compiled in rows), "lrrrrr")
    if loader_ips is not None:
        print(f"\nloader alone: {loader_ips:.0f} img/s ({args.workers} workers)"
              + (f"; median trainer rate {statistics.median(r[3] for r in rows):.0f} img/s" if rows else ""))
    print_command(__file__, argv)


if __name__ == "__main__":
    main()
