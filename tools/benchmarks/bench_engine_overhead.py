#!/usr/bin/env python
"""Benchmark the engine's overhead: time spent in hooks versus training steps.

Trains a small conv net (3 conv-BN-ReLU blocks, ~25k parameters) on random 3x128x64 batches of 64
on the CPU with a training run's default hooks: IterationTimer, LRScheduler, PeriodicWriter
(CommonMetricPrinter + JSONWriter + TensorboardXWriter, every 20 iterations) and
PeriodicCheckpointer (to a temporary folder). "On hooks" is IterationTimer's figure: wall time
after the warm-up spent outside the steps. The target is < 2 % of the total training time.

With --main-job it takes apart one iteration of the README main job's real trainer loop
(NUM_WORKERS 0: loading runs in this process) in CPU seconds of one thread, which a busy machine
barely changes: the whole iteration, the loader's part, and blocks of model-only steps (a fixed
batch, the same model and optimizer) between the loop's. Iteration - loader - model-only is what
the engine adds (hooks, writers, loss staging, LR scheduling).
"""

import argparse
import logging
import os
import statistics
import tempfile
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from harness import REPO, StepTimer, Stopwatch, TrainOnly, random_batch, timed, train_step
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.engine import HookBase, SimpleTrainer, hooks
from reid_engine.integrations.event_writers import JSONWriter, TensorboardXWriter
from reid_engine.utils.checkpoint import Checkpointer
from reid_engine.utils.events import CommonMetricPrinter
from reid_engine.utils.logger import setup_logger

TARGET_PERCENT = 2.0
NUM_CLASSES = 50
MAIN_JOB = os.path.join(REPO, "configs", "SyntheticReID", "bagtricks_R18-half-ibn.yml")


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
        return {"loss_cls": F.cross_entropy(logits, batch["targets"]), "loss_reg": 1e-3 * features.pow(2).mean()}


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

            def timed_phase(original=original, name=type(hook).__name__):
                spent[name] += timed(original)[0][0]

            setattr(hook, phase, timed_phase)
    return spent


def _cpu_timed(iterator, seconds: list):
    """The items of `iterator`, the CPU seconds of each ``next`` appended to `seconds`."""
    while True:
        with Stopwatch() as watch:
            batch = next(iterator)
        seconds.append(watch.cpu)
        yield batch


class _ModelOnlyBlocks(HookBase):
    """After every `block` iterations, runs `block` model-only steps on `batch` and records their
    CPU seconds, outside the loop iterations `loop` times; measures the trainer's stream (`loader`)."""

    def __init__(self, batch, block: int, loop: StepTimer):
        self.batch, self.block, self.loop = batch, block, loop
        self.model, self.loader = [], None

    def before_step(self):
        if self.loader is None:  # the trainer's own stream, measured from the first step on
            inner, self.loader = self.trainer._trainer, []
            inner._data_loader_iter_obj = _cpu_timed(inner._data_loader_iter, self.loader)

    def after_step(self):
        if (self.trainer.iter + 1) % self.block:
            return
        step = train_step(self.trainer.model, self.trainer.optimizer, self.batch)
        for _ in range(self.block):
            with self.loop.excluded(), Stopwatch() as watch:
                step()
            self.model.append(watch.cpu)


def main_job_breakdown(args) -> None:
    """Print the CPU-second breakdown of a main-job iteration (see the module docstring)."""
    torch.set_num_threads(1)
    logging.getLogger("reid_engine").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as output_dir:
        cfg = get_cfg()
        cfg.merge_from_file(MAIN_JOB)
        cfg.DATASETS.ROOT, cfg.OUTPUT_DIR, cfg.DATALOADER.NUM_WORKERS = args.data_root, output_dir, 0
        batch = random_batch(cfg.SOLVER.IMS_PER_BATCH, cfg.DATALOADER.NUM_INSTANCE, *cfg.INPUT.SIZE_TRAIN)
        iterations = StepTimer(clock=time.process_time)
        breakdown = _ModelOnlyBlocks(batch, 4, iterations)
        TrainOnly(cfg, 4 + args.iters, [iterations, breakdown]).train()
    skip = 3  # the first iterations: start-up
    loop = statistics.median(iterations.iterations[skip:])
    loader, model = statistics.median(breakdown.loader[skip:]), statistics.median(breakdown.model)
    print(f"main job ({os.path.relpath(MAIN_JOB, REPO)}), batch {cfg.SOLVER.IMS_PER_BATCH}, 1 torch thread, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; CPU seconds, medians of "
          f"{len(iterations.iterations) - skip} loop iterations and {len(breakdown.model)} model-only steps")
    print(f"loop iteration {loop:.4f} s = loader {loader:.4f} s ({100 * loader / model:.1f} % of the model step) "
          f"+ model step and engine {loop - loader:.4f} s")
    print(f"model-only step {model:.4f} s; engine (iteration - loader - model-only): {loop - loader - model:+.4f} s "
          f"({100 * (loop - loader - model) / model:+.1f} % of the model step)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--checkpoint-period", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--main-job", action="store_true", help="take apart a main-job iteration instead")
    parser.add_argument("--data-root", default=os.path.join(REPO, "datasets"), help="with --main-job")
    args = parser.parse_args()
    setup_logger(color=False)
    if args.main_job:
        return main_job_breakdown(args)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    logging.getLogger("reid_engine").setLevel(logging.WARNING)  # keep the output to the figures
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as output_dir:
        model = SmallConvNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        trainer = SimpleTrainer(model, random_batches(8), optimizer)
        trainer.scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[args.iters // 2], gamma=0.1)
        checkpointer = Checkpointer(model, output_dir, trainer=trainer)
        timer = hooks.IterationTimer()
        writers = [CommonMetricPrinter(args.iters), JSONWriter(os.path.join(output_dir, "metrics.json")),
                   TensorboardXWriter(output_dir)]
        hook_list = [timer, hooks.LRScheduler(), hooks.PeriodicWriter(writers, period=20),
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
    print(f"on hooks: {percent:.2f} % of total training time (target < {TARGET_PERCENT:.0f} %): "
          f"{'OK' if percent < TARGET_PERCENT else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
