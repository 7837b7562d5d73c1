"""The main job's training step on a machine it shares: quiet, and beside busy processes.

Runs the real command (`tools/train_net.py`, the main job's config, a few epochs without
evaluation) once per variant, interleaved over rounds, and reads the per-window step time
(`time` of metrics.json, one value per 20-iteration logging window) of each run:

- code: the working tree, or `--revisions REV ...` (each checked out in a temporary worktree);
- load: `--loads 0 1 2`, how many single-threaded busy processes run beside it (`--busy-nice`, default 0:
  `python -c 'while True: pass'`), started before the run or `--busy-after S` seconds into it;
- threads: the run plan's CPU threads, or `--threads N` forced through OMP_NUM_THREADS;
- OpenMP wait policy: the command line's (``cli``: the run plan's, docs/performance.md), OpenMP's
  default (``torch``: threads spin a while before they sleep), ACTIVE or PASSIVE through
  OMP_WAIT_POLICY, or ``spin:N`` (GOMP_SPINCOUNT=N: spin N rounds, then sleep);
- placement: the whole machine, ``pin:N`` (affinity to the first N cores: an N-core machine) or
  ``quota:N`` (a cgroup with a quota of N CPUs on all cores, as a container limited to N CPUs
  on a larger host; needs root and a writable cgroup v1 cpu controller or cgroup v2).

It prints, per variant, the median and the worst window, the worst window against the quiet
median of the same variant, and the median against the first variant's quiet median.

    python tools/benchmarks/bench_shared_cores.py --data-root datasets --epochs 2 --rounds 2
    # the thread policy against the code before it, quiet and beside one and two busy processes:
    python tools/benchmarks/bench_shared_cores.py --revisions 61f432c 4ff093f . --policies cli --loads 0 1 2
    # a container limited to 1 CPU against a 1-core machine (plan's threads, and 2 forced threads):
    python tools/benchmarks/bench_shared_cores.py --policies cli --threads plan 2 --placements pin:1 quota:1 \
        --loads quiet --epochs 1 --rounds 2
"""
import argparse
import atexit
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, Iterator, List

from harness import Stopwatch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "SyntheticReID", "bagtricks_R18-half-ibn.yml")
# A busy single-threaded Python process at the nice value of its argument.
BUSY = "import os, sys; os.nice(int(sys.argv[1]))\nwhile True: pass\n"


@contextlib.contextmanager
def busy_processes(count: int, nice: int = 0) -> Iterator[List[subprocess.Popen]]:
    """`count` busy single-threaded processes at `nice` while the block runs (the load of a
    shared machine); they are killed when it ends.

    Args:
        count: how many (0: none).
        nice: their nice value.
    Yields:
        the processes.
    """
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(nice)]) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _placer(placement: str, cgroup: str):
    """A preexec function that puts the child where `placement` says (None for the whole machine)."""
    kind, _, count = placement.partition(":")
    if kind == "machine":
        return None
    if kind == "pin":
        cpus = sorted(os.sched_getaffinity(0))[:int(count)]
        return lambda: os.sched_setaffinity(0, cpus)
    if kind == "quota":
        procs = os.path.join(cgroup, "cgroup.procs")
        return lambda: open(procs, "w").write(str(os.getpid()))
    raise SystemExit(f"unknown placement {placement!r}: use machine, pin:N or quota:N")


def make_cgroup(cpus: float) -> str:
    """A cgroup limited to `cpus` CPUs (v1's cpu controller or v2), removed at exit."""
    v1 = os.path.isdir("/sys/fs/cgroup/cpu")
    folder = os.path.join("/sys/fs/cgroup/cpu" if v1 else "/sys/fs/cgroup", f"reid_engine_bench_{os.getpid()}")
    os.makedirs(folder)
    quota = int(cpus * 100000)
    settings = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(quota)} if v1 else {"cpu.max": f"{quota} 100000"}
    for name, value in settings.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(value)
    atexit.register(os.rmdir, folder)
    return folder


@contextlib.contextmanager
def checkouts(revisions: List[str]) -> Iterator[Dict[str, str]]:
    """{revision: source folder}: ``.`` is this working tree, any other revision a temporary detached
    git worktree, removed when the block ends."""
    folders, made = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for rev in revisions:
                if rev == ".":
                    folders[rev] = ROOT
                    continue
                folders[rev] = os.path.join(tmp, rev.replace("/", "_"))
                subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", folders[rev], rev], check=True)
                made.append(folders[rev])
            yield folders
        finally:
            for folder in made:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", folder], check=False)


def policy_env(policy: str, threads: str) -> Dict[str, str]:
    """The environment of a run with OpenMP wait `policy` and `threads` (see the module docstring)."""
    own = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "REID_ENGINE_BUSY_CPUS")
    env = {k: v for k, v in os.environ.items() if k not in own}
    if policy == "torch":
        env["OMP_WAIT_POLICY"] = ""  # set but empty: the command line keeps it, OpenMP uses its default
    elif policy.startswith("spin:"):
        env["OMP_WAIT_POLICY"], env["GOMP_SPINCOUNT"] = "", policy.split(":")[1]
    elif policy != "cli":
        env["OMP_WAIT_POLICY"] = policy
    if threads != "plan":
        env["OMP_NUM_THREADS"] = threads
    return env


def run_once(args, source: str, output_dir: str, policy: str, threads: str, load: int, placement: str = "machine",
             cgroups: Dict[str, str] = None) -> List[float]:
    """One training run of the code in `source`; returns the step time of each logging window after the first."""
    env = policy_env(policy, threads)
    env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.join(source, "tools", "train_net.py"), "--config-file",
           os.path.join(source, os.path.relpath(args.config, ROOT)),
           "DATASETS.ROOT", args.data_root, "OUTPUT_DIR", output_dir, "SOLVER.MAX_EPOCH", str(args.epochs),
           "TEST.EVAL_PERIOD", "1000", "DATASETS.TESTS", "()", "SOLVER.CHECKPOINT_PERIOD", "1000"]
    with contextlib.ExitStack() as neighbours:
        if not args.busy_after:
            neighbours.enter_context(busy_processes(load, args.busy_nice))
        run = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=_placer(placement, (cgroups or {}).get(placement, "")))
        if args.busy_after:
            try:
                run.wait(timeout=args.busy_after)
            except subprocess.TimeoutExpired:  # still running: the neighbours arrive mid-run
                neighbours.enter_context(busy_processes(load, args.busy_nice))
        if run.wait() != 0:
            raise SystemExit(f"the run failed (exit {run.returncode}): {' '.join(cmd)}")
    times = []
    with open(os.path.join(output_dir, "metrics.json")) as f:
        for line in f:
            record = json.loads(line)
            if "time" in record:
                times.append(float(record["time"]))
    return times[1:] or times  # the first window holds the warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default=os.path.join(ROOT, "datasets"))
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--revisions", nargs="+", default=["."], help="git revisions to compare (. = this tree)")
    parser.add_argument("--policies", nargs="+", default=["cli", "torch"],
                        help="cli (the command line's choice), torch (OpenMP's default: spin, then sleep), an "
                        "OMP_WAIT_POLICY value (ACTIVE, PASSIVE) or spin:N (GOMP_SPINCOUNT)")
    parser.add_argument("--threads", nargs="+", default=["plan"], help="plan, or a thread count")
    parser.add_argument("--placements", nargs="+", default=["machine"], help="machine, pin:N or quota:N")
    parser.add_argument("--loads", nargs="+", type=int, default=[0, 1], help="busy processes beside the run")
    parser.add_argument("--busy-nice", type=int, default=0, help="the busy processes' nice value")
    parser.add_argument("--busy-after", type=float, default=0, help="start the busy processes this many seconds "
                        "into the run (0: before it)")
    args = parser.parse_args()
    cgroups = {p: make_cgroup(float(p.split(":")[1])) for p in args.placements if p.startswith("quota:")}
    variants = [(rev, policy, threads, load, placement) for rev in args.revisions for policy in args.policies
                for threads in args.threads for placement in args.placements for load in args.loads]
    windows: Dict[tuple, List[float]] = {v: [] for v in variants}
    with checkouts(args.revisions) as sources, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (rev, *variant) in enumerate(variants):
                with Stopwatch() as watch:
                    windows[(rev, *variant)] += run_once(args, sources[rev], os.path.join(tmp, f"r{r}_{i}"), *variant,
                                                         cgroups=cgroups)
                print(f"round {r + 1}/{args.rounds} {(rev, *variant)}: {watch.wall:.0f} s", flush=True)
    reference = statistics.median(windows[variants[0][:3] + (min(args.loads),) + variants[0][4:]])
    print(f"\n{'code':>8} {'policy':>10} {'threads':>7} {'placement':>9} {'busy':>4} {'windows':>7} {'median s/it':>11} "
          f"{'worst s/it':>10} {'worst / quiet median':>20} {'median / reference':>18}")
    for rev, policy, threads, load, placement in variants:
        values = windows[(rev, policy, threads, load, placement)]
        quiet = statistics.median(windows[(rev, policy, threads, min(args.loads), placement)])
        print(f"{rev:>8} {policy:>10} {threads:>7} {placement:>9} {load:>4} {len(values):>7} "
              f"{statistics.median(values):>11.3f} {max(values):>10.3f} {max(values) / quiet:>19.2f}x "
              f"{statistics.median(values) / reference:>17.2f}x")
    print(f"reference: the quiet median of {variants[0][:3]}, {reference:.3f} s/it")


if __name__ == "__main__":
    main()
