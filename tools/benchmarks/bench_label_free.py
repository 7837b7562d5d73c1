#!/usr/bin/env python
"""Measure label-free domain adaptation on the synthetic shift: direct transfer, UDA and supervised
on SyntheticReIDShifted, side by side, and the fraction of the gap UDA recovers.

Three runs of the real command line (`tools/train_net.py`):
1. source: the supervised config trained on SyntheticReID's labels, tested on SyntheticReIDShifted;
2. UDA: the demo config (cluster contrast) from the source weights, without the target's labels;
3. supervised: the supervised config on SyntheticReIDShifted's labels (the upper bound).
It prints their test metrics and wall times and (UDA - direct) / (supervised - direct), the share
of the gap UDA recovers (issue target: >= 70%).

    python tools/benchmarks/bench_label_free.py --reuse --uda-epochs 12     # tune UDA, keep the two others
"""
import argparse
import os
from typing import List, Optional

from bench_distillation import print_runs, run_job  # run the real command, read its metrics
from harness import REPO, print_command

SUPERVISED = os.path.join(REPO, "configs", "SyntheticReID", "bagtricks_R18_quick.yml")
UDA = os.path.join(REPO, "configs", "UDA", "cc_R18_SyntheticReID-to-SyntheticReIDShifted.yml")
SOURCE, TARGET = "SyntheticReID", "SyntheticReIDShifted"
# The supervised runs use the demo's backbone, so that its MODEL.WEIGHTS come from run 1.
SUPERVISED_OPTS = ["MODEL.BACKBONE.WIDTH_MULT", "0.5"]


def schedule(epochs: int) -> List[str]:
    """MAX_EPOCH and MultiStepLR steps at about 70% and 90% of it (the supervised config's shape)."""
    return ["SOLVER.MAX_EPOCH", str(epochs), "SOLVER.STEPS", f"({max(1, round(epochs * 0.7))}, "
            f"{max(1, round(epochs * 0.9))})", "SOLVER.CHECKPOINT_PERIOD", str(epochs)]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--supervised", default=SUPERVISED, help="the supervised config (source and upper bound)")
    parser.add_argument("--uda", default=UDA, help="the label-free config")
    parser.add_argument("--source-epochs", type=int, default=40, help="epochs of the two supervised runs (40: "
                        "the source model the demo config's header trains)")
    parser.add_argument("--uda-epochs", type=int, default=0, help="UDA epochs (0: the config's)")
    parser.add_argument("--reuse", action="store_true", help="reuse the finished source and supervised runs of "
                                                              "--output (their model_final.pth and log), e.g. to tune UDA")
    parser.add_argument("--output", default=os.path.join(REPO, "output", "bench_label_free"))
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE overrides for every run")
    args = parser.parse_args(argv)
    common = list(args.opts) + ["TEST.EVAL_PERIOD", "0"]  # one evaluation, at the end
    supervised = common + SUPERVISED_OPTS + schedule(args.source_epochs)
    results = {"direct": run_job("source", args.supervised, supervised + [
        "DATASETS.NAMES", f"('{SOURCE}',)", "DATASETS.TESTS", f"('{TARGET}',)"], args.output, args.reuse)}
    weights = os.path.join(args.output, "source", "model_final.pth")
    uda = common + ["MODEL.WEIGHTS", weights] + (["SOLVER.MAX_EPOCH", str(args.uda_epochs)] if args.uda_epochs else [])
    results["uda"] = run_job("uda", args.uda, uda, args.output)
    results["supervised"] = run_job("supervised", args.supervised, supervised + [
        "DATASETS.NAMES", f"('{TARGET}',)", "DATASETS.TESTS", f"('{TARGET}',)"], args.output, args.reuse)

    print(f"\ntarget {TARGET}; supervised: {os.path.relpath(args.supervised, REPO)} ({args.source_epochs} epochs); "
          f"UDA: {os.path.relpath(args.uda, REPO)}; overrides: {' '.join(common)}")
    print_runs(f"model on {TARGET}", {"direct": f"direct transfer (trained on {SOURCE})",
                                      "uda": "UDA (cluster contrast, no target labels)",
                                      "supervised": "supervised (target labels)"}, results)
    for metric in ("mAP", "Rank-1"):
        direct, got, best = (results[k].get(metric, float("nan")) for k in ("direct", "uda", "supervised"))
        gap = best - direct
        share = (got - direct) / gap if gap else float("nan")
        print(f"{metric}: supervised - direct = {gap:.1f} points; UDA recovers {got - direct:.1f} of them = "
              f"{100 * share:.0f}% of the gap (target >= 70%)")
    print_command(__file__, argv)


if __name__ == "__main__":
    main()
