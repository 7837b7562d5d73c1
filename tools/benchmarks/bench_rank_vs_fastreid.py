#!/usr/bin/env python
"""Market-size rank metrics from a precomputed distance matrix: ours against fast-reid's Cython evaluator.

Both run in this process on the same float32 distance matrix (bench_evaluation.py's Market-size
split), in interleaved rounds whose order alternates. It prints the median and every time of each,
the ratio (Cython / ours) and the largest difference of CMC ranks 1-50, mAP and mINP. ``--load N``
runs N busy single-threaded processes meanwhile (a shared machine).

fast-reid is never a dependency: build its evaluator in a scratch environment with the same Python
(3.11) and pass the compiled module, e.g.

    python3.11 -m venv /tmp/fastreid_venv && /tmp/fastreid_venv/bin/pip install cython numpy setuptools
    /tmp/fastreid_venv/bin/pip download --no-deps fastreid==1.4.0 -d /tmp/fastreid_src
    # unzip the wheel, copy fastreid/evaluation/rank_cylib/rank_cy.pyx to /tmp/fastreid_cy, and there
    # build it (-O3) with a setup.py of: setup(ext_modules=cythonize([Extension("rank_cy", ["rank_cy.pyx"],
    #     include_dirs=[numpy.get_include()])])), i.e. /tmp/fastreid_venv/bin/python setup.py build_ext --inplace
    python tools/benchmarks/bench_rank_vs_fastreid.py \
        --fastreid-rank-cy /tmp/fastreid_cy/rank_cy.cpython-311-x86_64-linux-gnu.so --rounds 7 [--load 1]

To time another version of this package, put it first on PYTHONPATH (the timed module's path is printed).
"""
import argparse
import contextlib
import importlib.util
import os
import platform
import statistics
import time

import numpy as np
import torch
from bench_evaluation import SIZES, make_split  # the benchmark's random identity-structured split
from bench_shared_cores import busy_processes
from harness import interleaved

from reid_engine.evaluation import evaluate_rank, iter_distance_chunks
from reid_engine.evaluation import rank as rank_module


def load_rank_cy(path: str):
    """Import fast-reid's compiled ``rank_cy`` extension from its file."""
    spec = importlib.util.spec_from_file_location("rank_cy", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path} is not an importable extension module; pass the compiled rank_cy*.so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fastreid_metrics(rank_cy, dist, qp, gp, qc, gc, max_rank=50):
    """fast-reid's numbers: CMC from evaluate_cy, mAP / mINP as the means of its per-query AP / INP."""
    cmc, all_ap, all_inp = rank_cy.evaluate_cy(dist, qp, gp, qc, gc, max_rank)
    return np.asarray(cmc, dtype=np.float64), float(np.mean(all_ap)), float(np.mean(all_inp))


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (platform.processor() is often empty)."""
    fallback = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), fallback)
    return fallback


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fastreid-rank-cy", required=True, help="path of fast-reid's compiled rank_cy*.so")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each (after one warm-up)")
    parser.add_argument("--load", type=int, default=0, help="busy processes running during the timed rounds")
    parser.add_argument("--load-nice", type=int, default=0, help="nice value of the busy processes")
    parser.add_argument("--dim", type=int, default=2048, help="feature dimension of the random features")
    parser.add_argument("--noise", type=float, default=3.0, help="noise scale around identity centres")
    args = parser.parse_args()
    rank_cy = load_rank_cy(args.fastreid_rank_cy)

    num_query, num_gallery, ids, cams = SIZES["market"]
    qf, gf, qp, gp, qc, gc = make_split(num_query, num_gallery, ids, cams, args.dim, args.noise)
    dist = torch.cat([d for _, d in iter_distance_chunks(qf, gf, "cosine")]).numpy()
    qp, gp, qc, gc = (t.numpy() for t in (qp, gp, qc, gc))
    del qf, gf
    print(f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"numpy {np.__version__}, load average {os.getloadavg()[0]:.2f}")
    print(f"ours: {rank_module.__file__}\nfast-reid: {args.fastreid_rank_cy}")
    print(f"distance matrix {dist.shape[0]} x {dist.shape[1]} {dist.dtype}, {ids} ids, {cams} cameras; "
          f"{args.rounds} interleaved rounds, {args.load} busy process(es) at nice {args.load_nice}")

    runs = {"ours": lambda: evaluate_rank(dist, qp, gp, qc, gc, max_rank=50),
            "fast-reid Cython": lambda: fastreid_metrics(rank_cy, dist, qp, gp, qc, gc)}
    results = {name: fn() for name, fn in runs.items()}  # warm-up, and the metrics compared below
    with busy_processes(args.load, args.load_nice):
        time.sleep(1.0 if args.load else 0.0)  # let them reach the scheduler's steady state
        times = interleaved(runs, args.rounds, rotate=True)  # two of them: the order alternates
        load_seen = os.getloadavg()[0]

    for name, values in times.items():
        print(f"  {name:17s} median {statistics.median(values):.3f} s   [{', '.join(f'{v:.3f}' for v in values)}]")
    ratio = statistics.median(times["fast-reid Cython"]) / statistics.median(times["ours"])
    print(f"  speed-up (Cython median / ours median): {ratio:.2f}x   (load average at the end {load_seen:.2f})")
    ours, theirs = results["ours"], results["fast-reid Cython"]
    print(f"  max |diff| CMC ranks 1-50 {np.abs(ours[0] - theirs[0]).max():.2e}, "
          f"mAP {abs(ours[1] - theirs[1]):.2e}, mINP {abs(ours[2] - theirs[2]):.2e}")
    print(f"  ours: rank-1 {ours[0][0]:.4f}, mAP {ours[1]:.4f}, mINP {ours[2]:.4f}")


if __name__ == "__main__":
    main()
