#!/usr/bin/env python
"""Measure the knowledge-distillation gain on SyntheticReID: a student trained with and without a teacher.

Three runs of the real command line (`tools/train_net.py`) on the same data, seed and schedule:
1. the teacher: the student config with a deeper backbone (--teacher-depth; skipped with --teacher-weights);
2. the student alone (the student config as it is);
3. the student as a `Distiller`: the frozen teacher's logits through `loss_jsdiv` (KD.MODEL_CONFIG / KD.MODEL_WEIGHTS).
It prints the test metrics of the three, the gain (3 minus 2) and the wall time of each run.
"""
import argparse
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional

from harness import REPO, Stopwatch, print_command, print_table

from reid_engine.evaluation import parse_csv_format

STUDENT = os.path.join(REPO, "configs", "SyntheticReID", "bagtricks_R18_quick.yml")
METRICS = ("Rank-1", "mAP", "mINP")


def final_metrics(output_dir: str) -> Dict[str, float]:
    """The metrics of the last evaluation a finished run printed to its log.txt (the first test set)."""
    with open(os.path.join(output_dir, "log.txt"), encoding="utf-8") as f:
        return next(iter(parse_csv_format(f.read()).values()), {})


def run_job(name: str, config: str, overrides: List[str], output: str, reuse: bool = False) -> Dict[str, float]:
    """Run `tools/train_net.py` for one job (console to OUTPUT_DIR/log.txt); its final metrics and "seconds"
    (with `reuse`, a finished run's metrics). Exits with the job's code when it fails."""
    out = os.path.join(output, name)
    if reuse and os.path.exists(os.path.join(out, "model_final.pth")):
        print(f"{name}: reusing {out}", flush=True)
        return {**final_metrics(out), "seconds": float("nan")}
    cmd = [sys.executable, os.path.join(REPO, "tools", "train_net.py"), "--config-file", config, "OUTPUT_DIR", out, *overrides]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(cmd[1:])}", flush=True)
    with Stopwatch() as watch:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = watch.wall
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        sys.exit(f"{name} failed with exit code {proc.returncode}; its log is {out}/log.txt")
    metrics = final_metrics(out)
    print(f"    done in {seconds / 60:.1f} min: " + ", ".join(f"{k} {metrics.get(k, float('nan')):.1f}" for k in METRICS),
          flush=True)
    return {**metrics, "seconds": seconds}


def print_runs(title: str, labels: Dict[str, str], results: Dict[str, Dict[str, float]]) -> None:
    """The test metrics and the wall minutes of each run, as a markdown table."""
    rows = ((labels[key], *(f"{row.get(m, float('nan')):.1f}" for m in METRICS), f"{row['seconds'] / 60:.1f}")
            for key, row in results.items())
    print_table((title, *METRICS, "wall (min)"), rows, "l" + "r" * (len(METRICS) + 1))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--student", default=STUDENT, help="the student's config (default: the main job)")
    parser.add_argument("--teacher-depth", default="50x", help="the teacher's MODEL.BACKBONE.DEPTH")
    parser.add_argument("--epochs", type=int, default=0, help="student epochs (0: the config's MAX_EPOCH)")
    parser.add_argument("--teacher-epochs", type=int, default=0, help="teacher epochs (0: as the student)")
    parser.add_argument("--teacher-weights", default="", help="a trained teacher (skips training it)")
    parser.add_argument("--teacher-config", default="", help="the config of --teacher-weights (its config.yaml)")
    parser.add_argument("--output", default=os.path.join(REPO, "output", "bench_distillation"))
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE overrides for every run")
    args = parser.parse_args(argv)
    if bool(args.teacher_weights) != bool(args.teacher_config):
        parser.error("--teacher-weights and --teacher-config go together")
    common = list(args.opts) + (["SOLVER.MAX_EPOCH", str(args.epochs)] if args.epochs else [])
    # one evaluation, at the end: the schedule is the only difference between the runs
    common += ["TEST.EVAL_PERIOD", "0"]
    results = {}
    if args.teacher_weights:
        teacher_config, teacher_weights = args.teacher_config, args.teacher_weights
    else:
        teacher_opts = common + ["MODEL.BACKBONE.DEPTH", args.teacher_depth]
        if args.teacher_epochs:
            teacher_opts += ["SOLVER.MAX_EPOCH", str(args.teacher_epochs)]
        results["teacher"] = run_job("teacher", args.student, teacher_opts, args.output)
        teacher_config = os.path.join(args.output, "teacher", "config.yaml")
        teacher_weights = os.path.join(args.output, "teacher", "model_final.pth")
    results["student"] = run_job("student", args.student, common, args.output)
    kd = ["MODEL.META_ARCHITECTURE", "Distiller", "KD.MODEL_CONFIG", f"('{teacher_config}',)",
          "KD.MODEL_WEIGHTS", f"('{teacher_weights}',)"]
    results["student_kd"] = run_job("student_kd", args.student, common + kd, args.output)

    teacher = f"{teacher_weights} (config {teacher_config})" if args.teacher_weights else f"DEPTH {args.teacher_depth}"
    print(f"\nstudent: {os.path.relpath(args.student, REPO)}; teacher: {teacher}; overrides: {' '.join(common)}")
    print_runs("model", {"teacher": "teacher", "student": "student alone", "student_kd": "student + teacher (loss_jsdiv)"},
               results)
    gain = {m: results["student_kd"].get(m, float("nan")) - results["student"].get(m, float("nan")) for m in METRICS}
    print("\ndistillation gain (student + teacher - student alone): " + ", ".join(f"{m} {v:+.1f}" for m, v in gain.items()))
    print_command(__file__, argv)


if __name__ == "__main__":
    main()
