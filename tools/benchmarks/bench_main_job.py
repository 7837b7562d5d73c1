#!/usr/bin/env python
"""Benchmark the README's main job: the old and the new config side by side, in one process.

For each config it measures, on this machine and in the same process run:
- data generation: seconds to generate the SyntheticReID benchmark (once; both configs use it);
- the training step: seconds per iteration of the real DefaultTrainer built from the config
  (loader, model, optimizer, hooks), median over --iters iterations after --warmup;
- one evaluation: seconds of DefaultTrainer.test on the SyntheticReID test split;
and projects the whole job: generation + iterations x s/it + evaluations x s/eval, where the
iteration and evaluation counts come from the config (MAX_EPOCH, TEST.EVAL_PERIOD, the final
evaluation). It prints both projections and their ratio (new / old).

Examples:
    python tools/benchmarks/bench_main_job.py --new my_candidate.yml
    python tools/benchmarks/bench_main_job.py --new my_candidate.yml --iters 40 --skip-generation
"""
import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import torch

from reid_engine.config import get_cfg
from reid_engine.data.synthetic.generator import DEFAULT_SPEC, generate_synthetic_reid
from reid_engine.engine import DefaultTrainer
from reid_engine.engine.train_loop import HookBase
from reid_engine.utils.logger import setup_logger

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OLD = os.path.join(REPO, "configs", "SyntheticReID", "bagtricks_R18_quick.yml")


class _StepTimes(HookBase):
    """Wall time of each step (before_step to after_step)."""

    def __init__(self):
        self.times, self._start = [], None

    def before_step(self):
        self._start = time.perf_counter()

    def after_step(self):
        self.times.append(time.perf_counter() - self._start)


class _NoFinalEval(DefaultTrainer):
    @classmethod
    def test(cls, cfg, model, evaluators=None, final=False):
        return {}


def load_config(path: str, data_root: str, output_dir: str):
    """The job's config, pointed at `data_root`, writing to `output_dir`."""
    cfg = get_cfg()
    cfg.merge_from_file(path)
    cfg.DATASETS.ROOT = data_root
    cfg.OUTPUT_DIR = output_dir
    return cfg


def measure(path: str, args, output_dir: str) -> dict:
    """s/it, s/eval and the iteration and evaluation counts of the job in `path`."""
    cfg = load_config(path, args.data_root, output_dir)
    trainer = _NoFinalEval(cfg)
    steps = _StepTimes()
    trainer.register_hooks([steps])
    trainer._trainer._hooks = trainer._hooks
    trainer.max_iter = args.warmup + args.iters
    trainer.train()
    seconds_per_iter = statistics.median(steps.times[args.warmup:])
    start = time.perf_counter()
    DefaultTrainer.test(trainer.cfg, trainer.model)
    seconds_per_eval = time.perf_counter() - start
    total_iters = cfg.SOLVER.MAX_EPOCH * trainer.iters_per_epoch
    periodic = math.ceil(cfg.SOLVER.MAX_EPOCH / cfg.TEST.EVAL_PERIOD) - 1 if cfg.TEST.EVAL_PERIOD > 0 else 0
    return {"s_per_iter": seconds_per_iter, "iters": total_iters, "s_per_eval": seconds_per_eval,
            "evals": periodic + 1}  # the periodic ones before the end, and the final one


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=OLD, help="the previous main-job config")
    parser.add_argument("--new", required=True, help="the candidate main-job config to compare with --old")
    parser.add_argument("--data-root", default=os.path.join(REPO, "datasets"),
                        help="where SyntheticReID is (generated there on first use)")
    parser.add_argument("--iters", type=int, default=30, help="timed iterations per config")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations first")
    parser.add_argument("--skip-generation", action="store_true",
                        help="do not time a fresh generation of SyntheticReID (count it as 0 s)")
    args = parser.parse_args(argv)
    setup_logger()
    generation = 0.0
    if not args.skip_generation:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            generate_synthetic_reid(os.path.join(tmp, "SyntheticReID"), DEFAULT_SPEC)
            generation = time.perf_counter() - start
    rows = {}
    with tempfile.TemporaryDirectory() as out:
        for label, path in (("old", args.old), ("new", args.new)):
            rows[label] = measure(path, args, os.path.join(out, label))
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
    print()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; SyntheticReID generation {generation:.1f} s")
    print("| job | config | s/it | iterations | s/eval | evaluations | projected total (s) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    totals = {}
    for label, path in (("old", args.old), ("new", args.new)):
        r = rows[label]
        totals[label] = generation + r["iters"] * r["s_per_iter"] + r["evals"] * r["s_per_eval"]
        print(f"| {label} | {os.path.relpath(path, REPO)} | {r['s_per_iter']:.3f} | {r['iters']} | "
              f"{r['s_per_eval']:.1f} | {r['evals']} | {totals[label]:.0f} |")
    print(f"\nprojected compute new / old: {totals['new'] / totals['old']:.2f} "
          f"(target <= 0.50); per iteration {rows['new']['s_per_iter'] / rows['old']['s_per_iter']:.2f}")
    print("command: python tools/benchmarks/bench_main_job.py " + " ".join(argv if argv is not None else sys.argv[1:]))


if __name__ == "__main__":
    main()
