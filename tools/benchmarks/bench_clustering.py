#!/usr/bin/env python
"""Benchmark of pseudo-label clustering at MSMT17 size: the Jaccard graph, DBSCAN, time and peak memory.

The pool is MSMT17's training set as label-free training sees it: 32,621 L2-normalised features
of 2,048 dimensions from 1,041 identities (~31 images each, a varying number), each an identity
centre plus a camera style offset plus noise. It runs ``jaccard_distance_graph`` and
``dbscan_pseudo_labels`` with cluster contrast's settings (PSEUDO's defaults) and prints:

- the time of the graph, of DBSCAN and the total, wall and CPU seconds (all threads);
- the peak resident set with the features alone and after the clustering (the difference bounds
  the clustering's working memory);
- the graph's size and the pseudo-label quality against the true identities.

Targets (issue 26): at most 60 s and at most 4 GB peak on a 2-core CPU.
"""
import argparse

import numpy as np
import torch
from harness import Stopwatch, peak_rss_gb

from reid_engine.clustering import dbscan_max_distance, dbscan_pseudo_labels, jaccard_distance_graph, pseudo_label_quality
from reid_engine.config import get_cfg

TARGET_SECONDS, TARGET_GB = 60.0, 4.0


def make_pool(num: int, ids: int, dim: int, cams: int, noise: float, cam_style: float, pose: float, seed: int = 0):
    """Clustered features, L2-normalised, filled in blocks: an identity's centre (identities in groups of
    ~20 sharing half of it: people dressed alike), its camera's style offset, a pose offset from a
    32-dimensional subspace everyone shares (different people looking alike), and noise."""
    gen = torch.Generator().manual_seed(seed)
    unit = torch.nn.functional.normalize
    sizes = torch.randint(1, 2 * num // ids, (ids,), generator=gen).float()
    pids = torch.sort(torch.multinomial(sizes, num, replacement=True, generator=gen)).values  # uneven identity sizes
    groups = unit(torch.randn(max(1, ids // 20), dim, generator=gen), dim=1)
    centers = unit(unit(torch.randn(ids, dim, generator=gen), dim=1) + groups[torch.arange(ids) % len(groups)], dim=1)
    styles = unit(torch.randn(cams, dim, generator=gen), dim=1) * cam_style
    pose_basis = unit(torch.randn(32, dim, generator=gen), dim=1) * pose / 32 ** 0.5
    camids = torch.randint(0, cams, (num,), generator=gen)
    feats = torch.empty(num, dim)
    for s in range(0, num, 4096):
        block = feats[s:s + 4096]
        torch.randn(block.shape, generator=gen, out=block)
        block.mul_(noise / dim ** 0.5).add_(centers[pids[s:s + 4096]]).add_(styles[camids[s:s + 4096]])
        block.add_(torch.randn(block.shape[0], 32, generator=gen) @ pose_basis)
    feats = unit(feats, dim=1, out=feats)
    return feats, pids.numpy()


def main(argv=None):
    """Run the benchmark with ``argv`` (default: sys.argv[1:]) and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num", type=int, default=32621, help="features (MSMT17 train: 32,621)")
    parser.add_argument("--ids", type=int, default=1041, help="identities (MSMT17 train: 1,041)")
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--cams", type=int, default=15)
    parser.add_argument("--noise", type=float, default=1.0, help="noise norm relative to the unit identity centre")
    parser.add_argument("--cam-style", type=float, default=0.5, help="norm of the per-camera style offset")
    parser.add_argument("--pose", type=float, default=0.8, help="typical norm of the shared pose offset")
    pseudo = get_cfg().PSEUDO  # the defaults of label-free training
    for flag, key in (("--k1", "K1"), ("--k2", "K2"), ("--eps", "EPS"), ("--min-samples", "MIN_SAMPLES")):
        parser.add_argument(flag, type=type(pseudo[key]), default=pseudo[key], help=f"PSEUDO.{key}")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    feats, truth = make_pool(args.num, args.ids, args.dim, args.cams, args.noise, args.cam_style, args.pose)
    rss_before = peak_rss_gb()
    print(f"pool: {args.num:,} x {args.dim} features, {len(np.unique(truth)):,} identities, {args.cams} cameras; "
          f"{args.threads} thread(s); peak RSS with the features: {rss_before:.2f} GB")

    with Stopwatch() as graph_time:  # as the pseudo-label hook does: only the pairs DBSCAN can use (within eps)
        graph = jaccard_distance_graph(feats, k1=args.k1, k2=args.k2, max_distance=dbscan_max_distance(args.eps))
    print(f"jaccard_distance_graph (k1 {args.k1}, k2 {args.k2}): {graph_time.wall:.1f} s ({graph_time.cpu:.1f} CPU s), "
          f"{graph.nnz:,} stored pairs ({graph.nnz / args.num:.0f} per row, "
          f"{(graph.data.nbytes + graph.indices.nbytes) / 1e6:.0f} MB)", flush=True)
    with Stopwatch() as dbscan_time:
        labels = dbscan_pseudo_labels(graph, eps=args.eps, min_samples=args.min_samples)
    rss_after, total = peak_rss_gb(), graph_time.wall + dbscan_time.wall
    print(f"dbscan_pseudo_labels (eps {args.eps}, min_samples {args.min_samples}): {dbscan_time.wall:.1f} s "
          f"({dbscan_time.cpu:.1f} CPU s)")

    quality = pseudo_label_quality(labels, truth)
    print(f"pseudo labels: {int(quality['num_clusters']):,} clusters, {int(quality['num_outliers']):,} outliers; "
          f"NMI {quality['nmi']:.3f}, ARI {quality['ari']:.3f}, pairwise precision {quality['pairwise_precision']:.3f}, "
          f"recall {quality['pairwise_recall']:.3f}")
    print(f"total: {total:.1f} s, {graph_time.cpu + dbscan_time.cpu:.1f} CPU s (target <= {TARGET_SECONDS:.0f} s: "
          f"{'met' if total <= TARGET_SECONDS else 'NOT met'}, {total / TARGET_SECONDS:.2f}x the target)")
    print(f"peak RSS (ru_maxrss): {rss_after:.2f} GB for the process, {rss_after - rss_before:.2f} GB above the features "
          f"(target <= {TARGET_GB:.0f} GB: {'met' if rss_after <= TARGET_GB else 'NOT met'})")


if __name__ == "__main__":
    main()
