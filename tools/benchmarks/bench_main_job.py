#!/usr/bin/env python
"""Benchmark the README's main job: the old and the new config side by side, in one process.

For each config, on this machine and in the same run:
- data generation: seconds to generate the SyntheticReID benchmark (once, for both);
- the training step: seconds per iteration of the real DefaultTrainer built from the config, median
  over --iters iterations after --warmup; the two trainers (two threads, one training at a time)
  take turns of ceil(--iters / --rounds) steps, so that a drifting machine slows both alike;
- one evaluation: seconds of DefaultTrainer.test on the SyntheticReID test split.
It projects each whole job, generation + iterations x s/it + evaluations x s/eval (the counts from
MAX_EPOCH and TEST.EVAL_PERIOD, with the final evaluation), and prints their ratio (new / old).
"""
import argparse
import concurrent.futures
import math
import os
import statistics
import tempfile
import threading

import torch
from harness import REPO, StepTimer, Stopwatch, TrainOnly, print_command, print_table

from reid_engine.config import get_cfg
from reid_engine.data.synthetic.generator import DEFAULT_SPEC, generate_synthetic_reid
from reid_engine.engine import DefaultTrainer, HookBase
from reid_engine.utils.logger import setup_logger

OLD = os.path.join(REPO, "configs", "SyntheticReID", "bagtricks_R18_quick.yml")


def load_config(path: str, data_root: str, output_dir: str):
    """The job's config, pointed at `data_root`, writing to `output_dir`."""
    cfg = get_cfg()
    cfg.merge_from_file(path)
    cfg.DATASETS.ROOT, cfg.OUTPUT_DIR = data_root, output_dir
    return cfg


class _TakeTurns(HookBase):
    """Lets trainers in separate threads take turns: each runs `per_turn` steps, then hands
    the turn to the next one, so that only one trains at any moment."""

    def __init__(self, turns, index: int, per_turn: int):
        self.turns, self.index, self.per_turn, self._steps = turns, index, per_turn, 0

    def _hand_over(self):
        self.turns[self.index].clear()
        self.turns[(self.index + 1) % len(self.turns)].set()

    def before_step(self):
        # Hand over here rather than in after_step: the previous step's timed window (closed
        # by StepTimer.after_step) must end before the other trainer starts computing.
        if self._steps and self._steps % self.per_turn == 0:
            self._hand_over()
        if not self.turns[self.index].wait(timeout=3600):
            raise RuntimeError("bench_main_job: the other trainer never handed the turn back")

    def after_step(self):
        self._steps += 1

    def after_train(self):
        self._hand_over()  # a finished (or failed) trainer must not block the other


def build_trainer(path: str, args, output_dir: str, turn_hook: HookBase):
    """(trainer, its step timer) of `path`: warmup + iters iterations, no final evaluation, turns by `turn_hook`."""
    steps = StepTimer()  # after the turn hook: the wait for the turn is outside the timed window
    return TrainOnly(load_config(path, args.data_root, output_dir), args.warmup + args.iters, [turn_hook, steps]), steps


def train_in_turns(trainers) -> None:
    """Train every trainer in its own thread, taking turns; re-raise the first failure."""
    with concurrent.futures.ThreadPoolExecutor(len(trainers)) as pool:
        for future in [pool.submit(trainer.train) for trainer in trainers]:
            future.result()


def measure(trainer, steps, args) -> dict:
    """s/it of the timed iterations, s/eval, and the job's iteration and evaluation counts."""
    cfg = trainer.cfg
    with Stopwatch() as evaluation:
        DefaultTrainer.test(cfg, trainer.model)
    periodic = math.ceil(cfg.SOLVER.MAX_EPOCH / cfg.TEST.EVAL_PERIOD) - 1 if cfg.TEST.EVAL_PERIOD > 0 else 0
    return {"s_per_iter": statistics.median(steps.steps[args.warmup:]), "iters": cfg.SOLVER.MAX_EPOCH * trainer.iters_per_epoch,
            "s_per_eval": evaluation.wall, "evals": periodic + 1}  # the periodic ones before the end, and the final one


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=OLD, help="the previous main-job config")
    parser.add_argument("--new", required=True, help="the candidate main-job config to compare with --old")
    parser.add_argument("--data-root", default=os.path.join(REPO, "datasets"),
                        help="where SyntheticReID is (generated there on first use)")
    parser.add_argument("--iters", type=int, default=30, help="timed iterations per config")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations first")
    parser.add_argument("--rounds", type=int, default=4, help="the trainers alternate in turns of ceil(iters / rounds) steps")
    parser.add_argument("--skip-generation", action="store_true",
                        help="do not time a fresh generation of SyntheticReID (count it as 0 s)")
    args = parser.parse_args(argv)
    setup_logger()
    generation = 0.0
    if not args.skip_generation:
        with tempfile.TemporaryDirectory() as tmp, Stopwatch() as watch:
            generate_synthetic_reid(os.path.join(tmp, "SyntheticReID"), DEFAULT_SPEC)
        generation = watch.wall
    with tempfile.TemporaryDirectory() as out:
        turns = [threading.Event(), threading.Event()]
        turns[0].set()
        per_turn = max(1, math.ceil(args.iters / args.rounds))
        jobs = {label: build_trainer(path, args, os.path.join(out, label), _TakeTurns(turns, index, per_turn))
                for index, (label, path) in enumerate((("old", args.old), ("new", args.new)))}
        train_in_turns([trainer for trainer, _ in jobs.values()])
        rows = {label: measure(trainer, steps, args) for label, (trainer, steps) in jobs.items()}
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads; SyntheticReID generation {generation:.1f} s")
    totals = {label: generation + r["iters"] * r["s_per_iter"] + r["evals"] * r["s_per_eval"] for label, r in rows.items()}
    print_table(("job", "config", "s/it", "iterations", "s/eval", "evaluations", "projected total (s)"),
                ((label, os.path.relpath(getattr(args, label), REPO), f"{r['s_per_iter']:.3f}", r["iters"],
                  f"{r['s_per_eval']:.1f}", r["evals"], f"{totals[label]:.0f}") for label, r in rows.items()), "llrrrrr")
    print(f"\nprojected compute new / old: {totals['new'] / totals['old']:.2f} "
          f"(target <= 0.50); per iteration {rows['new']['s_per_iter'] / rows['old']['s_per_iter']:.2f}")
    print_command(__file__, argv)


if __name__ == "__main__":
    main()
