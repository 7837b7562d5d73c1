#!/usr/bin/env python
"""Benchmark of the evaluation layer: speed and peak memory at benchmark scale.

Cases, each in its own subprocess (its peak RSS is its own), on random features with identity
structure (identity centre + noise):
  market  Market-size metrics (3,368 x 15,913, 751 ids, 6 cameras) from a precomputed distance
          matrix and from features, beside the distance computation alone;
  msmt    MSMT17-size (11,659 x 82,161, 2048-d) features -> metrics against the distance
          computation alone (the matrix multiply is the floor), and peak RSS;
  rerank  k-reciprocal re-ranking on a Market-size pool (19,281 features): time and peak RSS.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
from harness import Stopwatch, peak_rss_gb, timed

from reid_engine.evaluation import evaluate_rank, evaluate_rank_from_features, iter_distance_chunks
from reid_engine.evaluation.rank import RankAccumulator
from reid_engine.evaluation.rerank import iter_rerank_chunks

SIZES = {  # queries, gallery, identities, cameras
    "market": (3368, 15913, 751, 6),
    "msmt": (11659, 82161, 3060, 15),
    "rerank": (3368, 15913, 751, 6),
}


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return 1024 * peak_rss_gb()


def make_split(num_query: int, num_gallery: int, ids: int, cams: int, dim: int, noise: float, seed: int = 0):
    """Random features with identity structure, written in place (no full-size temporaries)."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(ids, dim, generator=gen)
    q_pids = torch.randint(0, ids, (num_query,), generator=gen)
    g_pids = torch.randint(0, ids, (num_gallery,), generator=gen)
    q_cams = torch.randint(0, cams, (num_query,), generator=gen)
    g_cams = torch.randint(0, cams, (num_gallery,), generator=gen)

    def fill(pids):
        out = torch.empty(len(pids), dim)
        for s in range(0, len(pids), 4096):
            block = out[s:s + 4096]
            torch.randn(block.shape, generator=gen, out=block)
            block.mul_(noise).add_(centers[pids[s:s + 4096]])
        return out

    return fill(q_pids), fill(g_pids), q_pids, g_pids, q_cams, g_cams


def best(fn, repeat=1):
    """Best wall time of `repeat` calls and the last result."""
    times, result = timed(fn, repeat)
    return min(times), result


def distance_only(qf, gf, metric="cosine"):
    """Consume the distance blocks without ranking: the floor of features -> metrics."""
    for _, block in iter_distance_chunks(qf, gf, metric):
        block.sum()  # touch the block, as the metrics do at least once


def chunked_metrics(chunks, qp, gp, qc, gc):
    """(CMC, mAP, mINP) of the distance blocks `chunks` yields, as (start row, block)."""
    acc = RankAccumulator(qp, gp, qc, gc)
    for start, block in chunks:
        acc.update(start, block)
    return acc.summarize()


def case_market(args):
    qf, gf, qp, gp, qc, gc = make_split(*SIZES["market"], args.dim, args.noise)
    dist = torch.cat([d for _, d in iter_distance_chunks(qf, gf, "cosine")])
    t_dist, (cmc, m_ap, m_inp) = best(lambda: evaluate_rank(dist, qp, gp, qc, gc), repeat=3)
    with Stopwatch() as watch:
        evaluate_rank(dist, qp, gp, qc, gc)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy machine one thread avoids OpenMP stragglers
    t_dist_1, _ = best(lambda: evaluate_rank(dist, qp, gp, qc, gc), repeat=3)
    torch.set_num_threads(threads)
    t_floor, _ = best(lambda: distance_only(qf, gf), repeat=2)
    t_feat, _ = best(lambda: evaluate_rank_from_features(qf, gf, qp, gp, qc, gc), repeat=2)
    return {"metrics_from_distmat_s": t_dist, "metrics_from_distmat_cpu_s": watch.cpu,
            "metrics_from_distmat_1_thread_s": t_dist_1, "distance_only_s": t_floor, "features_to_metrics_s": t_feat,
            "ratio_features_to_metrics_over_distance": t_feat / t_floor, "rank1": float(cmc[0]), "mAP": m_ap, "mINP": m_inp,
            "peak_rss_mb": peak_rss_mb()}


def case_msmt(args):
    qf, gf, qp, gp, qc, gc = make_split(*SIZES["msmt"], args.dim, args.noise)
    rss_features = peak_rss_mb()
    t_floor, _ = best(lambda: distance_only(qf, gf))
    rss_floor = peak_rss_mb()

    t_feat, (cmc, m_ap, m_inp) = best(lambda: chunked_metrics(iter_distance_chunks(qf, gf, "cosine"), qp, gp, qc, gc))
    return {"distance_only_s": t_floor, "features_to_metrics_s": t_feat,
            "ratio_features_to_metrics_over_distance": t_feat / t_floor, "rank1": float(cmc[0]), "mAP": m_ap, "mINP": m_inp,
            "rss_after_features_mb": rss_features, "peak_rss_distance_only_mb": rss_floor, "peak_rss_mb": peak_rss_mb()}


def case_rerank(args):
    qf, gf, qp, gp, qc, gc = make_split(*SIZES["rerank"], args.dim, args.noise)
    rss_features = peak_rss_mb()

    t_rerank, (cmc, m_ap, m_inp) = best(lambda: chunked_metrics(iter_rerank_chunks(qf, gf, 20, 6, 0.3, "cosine"), qp, gp, qc, gc))
    base = evaluate_rank_from_features(qf, gf, qp, gp, qc, gc)
    n = qf.shape[0] + gf.shape[0]
    return {"pool": n, "rerank_and_metrics_s": t_rerank, "rank1": float(cmc[0]), "mAP": m_ap,
            "rank1_without_rerank": float(base[0][0]), "mAP_without_rerank": base[1], "rss_after_features_mb": rss_features,
            "peak_rss_mb": peak_rss_mb(), "one_dense_NxN_float32_mb": n * n * 4 / 2 ** 20}


CASES = {"market": case_market, "msmt": case_msmt, "rerank": case_rerank}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--dim", type=int, default=2048, help="feature dimension")
    parser.add_argument("--noise", type=float, default=3.0, help="noise scale around identity centres")
    parser.add_argument("--child", choices=list(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(CASES[args.child](args)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, feature dim {args.dim}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for case in args.cases:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", case, "--dim", str(args.dim), "--noise", str(args.noise)]
        q, g, ids, cams = SIZES[case]
        print(f"\n== {case}: {q} queries x {g} gallery, {ids} ids, {cams} cameras", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-2000:])
            raise SystemExit(f"case {case} failed")
        print(f"  (load average now {os.getloadavg()[0]:.1f})")
        for key, value in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            print(f"  {key:45s} {value:.4f}" if isinstance(value, float) else f"  {key:45s} {value}")


if __name__ == "__main__":
    main()
