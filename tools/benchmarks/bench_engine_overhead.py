#!/usr/bin/env python
"""Benchmark the engine's overhead: time spent in hooks versus training steps.

Trains a small conv net (3 conv-BN-ReLU blocks, ~25k parameters) on random 3x128x64
batches of 64 on the CPU with the default hook set of a training run: IterationTimer,
LRScheduler, PeriodicWriter (CommonMetricPrinter + JSONWriter + TensorboardXWriter, every
20 iterations) and PeriodicCheckpointer (model + optimizer + trainer state, to a temporary
folder). The "on hooks" time is what IterationTimer reports: wall time after the warm-up
spent outside the steps. The target is < 2 % of the total training time.

Usage:
    python tools/benchmarks/bench_engine_overhead.py [--iters 300] [--checkpoint-period 100]
        [--threads N]
"""

import argparse
import logging
import os
import tempfile
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

from reid_engine.engine import hooks
from reid_engine.engine.train_loop import SimpleTrainer
from reid_engine.utils.checkpoint import Checkpointer
from reid_engine.utils.events import CommonMetricPrinter, JSONWriter, TensorboardXWriter
from reid_engine.utils.logger import setup_logger

TARGET_PERCENT = 2.0
NUM_CLASSES = 50


class SmallConvNet(nn.Module):
    """Three stride-2 conv-BN-ReLU blocks, global pooling and a classifier; returns losses."""

    def __init__(self):
        super().__init__()
        layers, channels = [], 3
        for width in (16, 32, 64):
            layers += [nn.Conv2d(channels, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width),
                       nn.ReLU(inplace=True)]
            channels = width
        self.backbone = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, NUM_CLASSES)

    def forward(self, batch):
        features = self.backbone(batch["images"].float() / 255.0).mean(dim=(2, 3))
        logits = self.classifier(features)
        return {"loss_cls": F.cross_entropy(logits, batch["targets"]),
                "loss_reg": 1e-3 * features.pow(2).mean()}


def random_batches(count: int, batch_size: int = 64):
    """An infinite stream cycling over ``count`` pre-made uint8 batches (no loading cost)."""
    g = torch.Generator().manual_seed(0)
    batches = [{"images": torch.randint(0, 256, (batch_size, 3, 128, 64), dtype=torch.uint8, generator=g),
                "targets": torch.randint(0, NUM_CLASSES, (batch_size,), generator=g)} for _ in range(count)]
    while True:
        yield from batches


def time_hook_methods(hook_list):
    """Wrap each hook's after_step/before_step to accumulate its wall time by class."""
    spent = defaultdict(float)
    for hook in hook_list:
        for phase in ("before_step", "after_step"):
            original = getattr(hook, phase)

            def timed(original=original, name=type(hook).__name__):
                start = time.perf_counter()
                original()
                spent[name] += time.perf_counter() - start

            setattr(hook, phase, timed)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--checkpoint-period", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    setup_logger(color=False)
    logging.getLogger("reid_engine").setLevel(logging.WARNING)  # keep the output to the figures
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as output_dir:
        model = SmallConvNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[args.iters // 2], gamma=0.1)
        trainer = SimpleTrainer(model, random_batches(8), optimizer)
        trainer.scheduler = scheduler
        checkpointer = Checkpointer(model, output_dir, trainer=trainer)
        timer = hooks.IterationTimer()
        writers = [CommonMetricPrinter(args.iters), JSONWriter(os.path.join(output_dir, "metrics.json")),
                   TensorboardXWriter(output_dir)]
        hook_list = [timer, hooks.LRScheduler(),
                     hooks.PeriodicWriter(writers, period=20),
                     hooks.PeriodicCheckpointer(checkpointer, args.checkpoint_period)]
        spent = time_hook_methods(hook_list[1:])
        trainer.register_hooks(hook_list)
        trainer.train(0, args.iters)
        checkpoints = sorted(n for n in os.listdir(output_dir) if n.endswith(".pth"))

    timed_iters = args.iters - 3  # IterationTimer's warm-up
    step_time = timer.total_time - timer.hook_time
    percent = 100.0 * timer.hook_time / timer.total_time
    print(f"model: SmallConvNet ({sum(p.numel() for p in model.parameters())} parameters), batch 64x3x128x64, "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"iterations timed: {timed_iters}  checkpoints written: {len(checkpoints)} ({', '.join(checkpoints)})")
    print(f"total training time: {timer.total_time:.3f} s  in steps: {step_time:.3f} s "
          f"({1000 * step_time / timed_iters:.1f} ms / it)  on hooks: {timer.hook_time:.3f} s")
    for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<22s} {seconds:8.3f} s  ({1000 * seconds / args.iters:.2f} ms / it)")
    verdict = "OK" if percent < TARGET_PERCENT else "ABOVE TARGET"
    print(f"on hooks: {percent:.2f} % of total training time (target < {TARGET_PERCENT:.0f} %): {verdict}")


if __name__ == "__main__":
    main()
