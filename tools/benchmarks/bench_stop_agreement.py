#!/usr/bin/env python
"""Benchmark what preemption costs a multi-process run: the per-step stop agreement.

After every step the workers all-reduce (max) one integer over gloo so that all of them
stop after the same iteration (reid_engine.engine.preemption.agree_on_stop). This script
starts N gloo workers on this machine, times that call after a warm-up, and prints the
cost per step and its share of a training step of --step-ms milliseconds.

Usage:
    python tools/benchmarks/bench_stop_agreement.py [--workers 2] [--calls 2000] [--step-ms 100]
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from reid_engine.engine.launch import launch  # noqa: E402
from reid_engine.engine.preemption import agree_on_stop  # noqa: E402
from reid_engine.utils import comm  # noqa: E402


def _worker(calls: int, result_dir: str) -> None:
    for _ in range(100):  # warm-up: connections, allocator
        agree_on_stop(0)
    comm.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        agree_on_stop(0)
    seconds = time.perf_counter() - start
    with open(os.path.join(result_dir, f"rank{comm.get_rank()}"), "w") as f:
        f.write(repr(seconds / calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--step-ms", type=float, default=100.0, help="a training step, for the share")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        launch(_worker, args.workers, dist_url="auto", args=(args.calls, tmp), backend="gloo")
        per_call = max(float(open(os.path.join(tmp, f"rank{r}")).read()) for r in range(args.workers))
    print(f"stop agreement over {args.workers} gloo workers: {per_call * 1e6:.1f} us per step "
          f"({args.calls} calls, slowest worker)")
    print(f"share of a {args.step_ms:g} ms step: {100 * per_call * 1e3 / args.step_ms:.3f} %")


if __name__ == "__main__":
    main()
