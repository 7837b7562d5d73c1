#!/usr/bin/env python
"""Benchmark what preemption costs a multi-process run: the per-step stop agreement.

After every step the workers start an all-reduce (max) of one integer over gloo and read it one
step later, so that all stop after the same iteration without a step waiting for the others
(reid_engine.reliability.preemption.StopAgreement). This starts N gloo workers and times, after a
warm-up, that call with a --step-ms pause between calls (the step the all-reduce overlaps) and a
blocking all-reduce, per step and as a share of the step.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from harness import timed  # noqa: E402

from reid_engine.engine.launch import launch  # noqa: E402
from reid_engine.reliability.preemption import StopAgreement  # noqa: E402
from reid_engine.utils import comm  # noqa: E402


def _blocking(_signal: int) -> int:
    flag = torch.tensor([_signal], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=comm.object_collective_group())
    return int(flag.item())


def _time_calls(call, calls: int, step_s: float) -> float:
    """Seconds spent inside `call` per step, with a `step_s` pause (the step) between calls."""
    for _ in range(50):  # warm-up: connections, allocator
        call(0)
    comm.synchronize()
    spent = 0.0
    for _ in range(calls):
        time.sleep(step_s)  # the step, untimed
        spent += timed(lambda: call(0))[0][0]
    return spent / calls


def _worker(calls: int, step_ms: float, result_dir: str) -> None:
    agreement = StopAgreement()
    overlapped = _time_calls(agreement.exchange, calls, step_ms / 1e3)
    agreement.finish()
    blocking = _time_calls(_blocking, calls, step_ms / 1e3)
    with open(os.path.join(result_dir, f"rank{comm.get_rank()}"), "w") as f:
        f.write(f"{overlapped!r} {blocking!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=10.0, help="a training step (the pause between calls)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        launch(_worker, args.workers, dist_url="auto", args=(args.calls, args.step_ms, tmp), backend="gloo")
        results = [tuple(map(float, open(os.path.join(tmp, f"rank{r}")).read().split())) for r in range(args.workers)]
    overlapped, blocking = (max(r[i] for r in results) for i in (0, 1))
    for name, per_call in (("overlapped (StopAgreement, used)", overlapped), ("blocking all-reduce", blocking)):
        print(f"{name}: {per_call * 1e6:.1f} us per step over {args.workers} gloo workers "
              f"({100 * per_call * 1e3 / args.step_ms:.3f} % of a {args.step_ms:g} ms step; {args.calls} steps, "
              f"slowest worker)")
    print(f"ratio blocking / overlapped: {blocking / max(overlapped, 1e-9):.1f}x")


if __name__ == "__main__":
    main()
