#!/usr/bin/env python
"""Measure label-free domain adaptation on the synthetic shift: direct transfer, UDA and supervised
on SyntheticReIDShifted, side by side, and the fraction of the gap UDA recovers.

Three runs of the real command line (`tools/train_net.py`), one after another:
1. source: the supervised config trained with SyntheticReID's labels and tested on
   SyntheticReIDShifted, i.e. direct transfer;
2. UDA: the demo config (cluster contrast) from the source weights, on SyntheticReIDShifted
   without its labels;
3. supervised: the supervised config trained with SyntheticReIDShifted's labels (the upper bound).
It prints the test metrics of the three, the wall time of each run and
(UDA - direct) / (supervised - direct), the share of the gap UDA recovers (issue target: >= 70%).

Examples:
    python tools/benchmarks/bench_label_free.py                    # 40-epoch source and supervised runs (~27 min)
    python tools/benchmarks/bench_label_free.py --source-epochs 8 --uda-epochs 8 DATASETS.ROOT /data
    python tools/benchmarks/bench_label_free.py --reuse --uda-epochs 12     # tune UDA, keep the two others
"""
import argparse
import os
import sys
from typing import Dict, List, Optional

from bench_distillation import final_metrics, run_job  # run the real command, read its metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUPERVISED = os.path.join(REPO, "configs", "SyntheticReID", "bagtricks_R18_quick.yml")
UDA = os.path.join(REPO, "configs", "UDA", "cc_R18_SyntheticReID-to-SyntheticReIDShifted.yml")
SOURCE, TARGET = "SyntheticReID", "SyntheticReIDShifted"
# The supervised runs use the demo's backbone, so that its MODEL.WEIGHTS come from run 1.
SUPERVISED_OPTS = ["MODEL.BACKBONE.WIDTH_MULT", "0.5"]
METRICS = ("Rank-1", "mAP", "mINP")


def schedule(epochs: int) -> List[str]:
    """MAX_EPOCH and MultiStepLR steps at about 70% and 90% of it (the supervised config's shape)."""
    return ["SOLVER.MAX_EPOCH", str(epochs), "SOLVER.STEPS", f"({max(1, round(epochs * 0.7))}, "
            f"{max(1, round(epochs * 0.9))})", "SOLVER.CHECKPOINT_PERIOD", str(epochs)]


def job(name: str, config: str, overrides: List[str], args) -> Dict[str, float]:
    """`run_job`, or with --reuse the final metrics a finished run of that name left in --output."""
    out = os.path.join(args.output, name)
    if args.reuse and os.path.exists(os.path.join(out, "model_final.pth")):
        print(f"{name}: reusing {out}", flush=True)
        return {**final_metrics(out), "seconds": float("nan")}
    return run_job(name, config, overrides, args.output)


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
    results = {}
    results["direct"] = job("source", args.supervised, supervised + [
        "DATASETS.NAMES", f"('{SOURCE}',)", "DATASETS.TESTS", f"('{TARGET}',)"], args)
    weights = os.path.join(args.output, "source", "model_final.pth")
    uda = common + ["MODEL.WEIGHTS", weights] + (["SOLVER.MAX_EPOCH", str(args.uda_epochs)] if args.uda_epochs else [])
    results["uda"] = run_job("uda", args.uda, uda, args.output)
    results["supervised"] = job("supervised", args.supervised, supervised + [
        "DATASETS.NAMES", f"('{TARGET}',)", "DATASETS.TESTS", f"('{TARGET}',)"], args)

    print(f"\ntarget {TARGET}; supervised: {os.path.relpath(args.supervised, REPO)} ({args.source_epochs} epochs); "
          f"UDA: {os.path.relpath(args.uda, REPO)}; overrides: {' '.join(common)}")
    print("| model on " + TARGET + " | " + " | ".join(METRICS) + " | wall (min) |")
    print("|---|" + "---:|" * (len(METRICS) + 1))
    labels = {"direct": f"direct transfer (trained on {SOURCE})", "uda": "UDA (cluster contrast, no target labels)",
              "supervised": "supervised (target labels)"}
    for key, row in results.items():
        print(f"| {labels[key]} | " + " | ".join(f"{row.get(m, float('nan')):.1f}" for m in METRICS)
              + f" | {row['seconds'] / 60:.1f} |")
    for metric in ("mAP", "Rank-1"):
        direct, got, best = (results[k].get(metric, float("nan")) for k in ("direct", "uda", "supervised"))
        gap = best - direct
        share = (got - direct) / gap if gap else float("nan")
        print(f"{metric}: supervised - direct = {gap:.1f} points; UDA recovers {got - direct:.1f} of them = "
              f"{100 * share:.0f}% of the gap (target >= 70%)")
    print("command: python tools/benchmarks/bench_label_free.py " + " ".join(argv if argv is not None else sys.argv[1:]))


if __name__ == "__main__":
    main()
