#!/usr/bin/env python
"""Stress the end of two-worker gloo jobs: count workers that finish their work, then die of a signal.

Each run is a real job of two spawned workers: one DDP training step of a tiny model (DDP keeps
the process group alive past destroy_process_group) and an object all-gather (as the evaluation
does), then the end of the worker in one of three ways (--mode):

- test-before: the failing test's worker before issue 37 (barrier, destroy the group, return);
- launch-before: `launch`'s worker before issue 37 (its barrier and teardown, then return);
- after: `launch`'s worker as it is now (teardown, then `reliability.rendezvous.end_worker`).

An abort is a worker ending with SIGABRT (or another signal after "terminate called ..."); a
failure, a worker ending otherwise non-zero or a run hanging past --run-timeout. Aborts are rare on
an idle machine; `--starve` (default) makes them likely, as a loaded CI machine does, by pinning
each worker to one CPU and running gloo's threads at SCHED_IDLE for the all-gather and the
teardown. Each worker's stderr goes to a file (faulthandler on); the first failures are printed.
"""
import argparse
import contextlib
import faulthandler
import importlib
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from harness import Stopwatch  # noqa: E402

from reid_engine.reliability import rendezvous  # noqa: E402
from reid_engine.utils import comm  # noqa: E402

# the module, not the function `reid_engine.engine.launch` that the package exports
launch_module = importlib.import_module("reid_engine.engine.launch")

WORLD = 2
_TIMEOUT = timedelta(seconds=120)


def _starve_gloo_threads() -> None:
    """Pin this worker to one CPU and run gloo's worker threads only when that CPU is idle."""
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[comm.get_rank() % len(cpus)]
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            os.sched_setaffinity(int(tid), {cpu})
            if name.startswith("pt_gloo_runloop"):
                os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
        except OSError:  # a thread that ended meanwhile
            pass


def _job(starve: bool) -> None:
    """The work of one worker: a DDP step, then (with `starve`, gloo's threads starved from here
    on) an object all-gather, as the evaluation does; both checked."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.full((2, 4), float(comm.get_rank()))).sum().backward()
    assert torch.allclose(model.module.weight.grad, torch.full((1, 4), 1.0)), model.module.weight.grad
    if starve:
        _starve_gloo_threads()
    assert comm.all_gather(comm.get_rank()) == list(range(WORLD))


def _capture_stderr(log_dir: str, local_rank: int) -> None:
    """Send this worker's fd 2 (C++ messages included) to a file, with faulthandler on it."""
    fd = os.open(os.path.join(log_dir, f"rank{local_rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable(all_threads=True)


def _worker_test_before(local_rank: int, dist_url: str, log_dir: str, starve: bool) -> None:
    """The worker of tests/evaluation/test_distributed.py before issue 37 (where CI saw the abort)."""
    _capture_stderr(log_dir, local_rank)
    dist.init_process_group("gloo", init_method=dist_url, rank=local_rank, world_size=WORLD, timeout=_TIMEOUT)
    try:
        _job(starve)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _worker_launch_before(local_rank: int, dist_url: str, log_dir: str, starve: bool) -> None:
    """`launch`'s worker before issue 37: the same as now, without `end_worker`."""
    _capture_stderr(log_dir, local_rank)
    rendezvous.join_process_group("gloo", dist_url, WORLD, local_rank, WORLD, _TIMEOUT, 120.0)
    launch_module._setup_groups(WORLD)
    _job(starve)
    launch_module._shutdown()


def _worker_after(local_rank: int, dist_url: str, log_dir: str, starve: bool) -> None:
    """`launch`'s worker as it is now."""
    _capture_stderr(log_dir, local_rank)
    launch_module._distributed_worker(local_rank, _job, WORLD, WORLD, 0, "gloo", dist_url, (starve,), _TIMEOUT, 120.0, None)


_WORKERS = {"test-before": _worker_test_before, "launch-before": _worker_launch_before, "after": _worker_after}


class _Run:
    """One two-worker job in flight."""

    def __init__(self, mode: str, log_dir: str, starve: bool):
        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        url = f"tcp://127.0.0.1:{rendezvous.find_free_port()}"
        self.started = time.monotonic()
        self.context = mp.start_processes(_WORKERS[mode], args=(url, log_dir, starve), nprocs=WORLD,
                                          start_method="spawn", join=False)

    def exit_codes(self, run_timeout: float) -> Optional[List[Optional[int]]]:
        """The workers' exit codes once all ended (None for one killed after `run_timeout`), else None."""
        processes = self.context.processes
        if all(p.exitcode is not None for p in processes):
            return [p.exitcode for p in processes]
        if time.monotonic() - self.started < run_timeout:
            return None
        for p in processes:  # a hang: kill what still runs, and report it as None
            if p.exitcode is None:
                p.kill()
                p.join()
        return [None if p.exitcode == -signal.SIGKILL else p.exitcode for p in processes]

    def stderr(self, rank: int) -> str:
        """What worker `rank` wrote to its stderr ("" if it died before opening the file)."""
        with contextlib.suppress(FileNotFoundError), open(os.path.join(self.log_dir, f"rank{rank}.err"), errors="replace") as f:
            return f.read().strip()
        return ""

    def aborted(self, codes: List[Optional[int]]) -> bool:
        """Whether a worker died of SIGABRT, or of another signal after std::terminate (faulthandler's
        own dump can crash then, ending the process with SIGBUS or SIGSEGV instead)."""
        return any(code == -signal.SIGABRT or (code is not None and code < 0 and "terminate called" in self.stderr(rank))
                   for rank, code in enumerate(codes))

    def stderr_tails(self, lines: int = 12) -> str:
        """The last lines of each worker's stderr, indented."""
        tails = [(rank, self.stderr(rank).splitlines()[-lines:]) for rank in range(WORLD)]
        return "\n".join(f"  rank {rank} stderr:\n    " + "\n    ".join(tail) for rank, tail in tails if tail)


def stress(mode: str, runs: int, parallel: int, starve: bool, run_timeout: float, log_root: str) -> Dict[str, int]:
    """Run `runs` jobs, `parallel` at a time; return the counts of runs, aborts and other failures."""
    counts = {"runs": 0, "ok": 0, "aborts": 0, "failed": 0}
    in_flight: List[_Run] = []
    started = shown = 0
    while counts["runs"] < runs:
        while started < runs and len(in_flight) < parallel:
            in_flight.append(_Run(mode, os.path.join(log_root, mode, str(started)), starve))
            started += 1
        time.sleep(0.05)
        for run in list(in_flight):
            codes = run.exit_codes(run_timeout)
            if codes is None:
                continue
            in_flight.remove(run)
            counts["runs"] += 1
            outcome = "aborts" if run.aborted(codes) else "ok" if codes == [0] * WORLD else "failed"
            counts[outcome] += 1
            if codes != [0] * WORLD and shown < 2:  # where it happened: the first two only
                shown += 1
                print(f"[{mode}] run {counts['runs']}: exit codes {codes}\n{run.stderr_tails()}", flush=True)
            if counts["runs"] % 25 == 0:
                print(f"[{mode}] {counts['runs']}/{runs} runs, {counts['aborts']} aborts, {counts['failed']} failed", flush=True)
    return counts


def main(argv: Optional[List[str]] = None) -> int:
    """Run the loop for each mode and print runs, aborts and the rate; status 1 if `after` had a failed run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--mode", choices=(*_WORKERS, "all"), default="all")
    parser.add_argument("--parallel", type=int, default=3, help="jobs at a time")
    parser.add_argument("--no-starve", dest="starve", action="store_false",
                        help="leave the scheduling alone (aborts become rare)")
    parser.add_argument("--run-timeout", type=float, default=600.0, help="seconds before a job counts as hung")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    modes = tuple(_WORKERS) if args.mode == "all" else (args.mode,)
    results = {}
    with tempfile.TemporaryDirectory(prefix="stress_gloo_teardown_") as log_root:
        for mode in modes:
            with Stopwatch() as watch:
                results[mode] = stress(mode, args.runs, args.parallel, args.starve, args.run_timeout, log_root)
            results[mode]["seconds"] = round(watch.wall)
    for mode, c in results.items():
        print(f"{mode}: runs {c['runs']}, aborts {c['aborts']} ({100 * c['aborts'] / max(c['runs'], 1):.1f} %), "
              f"other failures {c['failed']}, {c['seconds']} s ({'starved' if args.starve else 'plain'} scheduling)")
    after = results.get("after", {})
    return 1 if after.get("aborts") or after.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
