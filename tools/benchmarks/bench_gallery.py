#!/usr/bin/env python
"""Benchmark of the gallery index (reid-index): build time, memory, query latency, QPS and recall@10.

The galleries imitate a trained model's features: from real ones (a reid-extract file, --features; a
checkpoint embedding SyntheticReID's test split, --checkpoint; else a tiny ResNet-18 trained into
--work-dir), in the top --dim principal directions, the distribution of identity centres, the pooled
within-identity covariance, each identity's relative spread and its image count; a gallery of N draws
new identities and images from that. Queries are held-out images of gallery identities.

For each size it builds the exact index (faiss flat) and what `reid-index build` picks (IVF-Flat
tuned to --recall-target; HNSW too up to --hnsw-max; Milvus Lite up to --milvus-max) through the
gallery API, and prints per index: build time, index size, peak RSS, latency p50 / p99 at batch 1
and per query at batch 64, queries per second (also as a multiple of exact search) and recall@10
against exact search; the last rows extrapolate 10M by a power-law fit. Searches run on --threads
faiss threads. `--replot r.json --plot qps.png` redraws an earlier run's figure.

Targets (issue 50), 1M 256-d features on 2 cores, approximate index: recall@10 >= 0.99,
p50 <= 5 ms at batch 1, >= 20x the exact search's queries per second.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from harness import REPO, Stopwatch, peak_rss_gb, print_table, timed

from reid_engine.gallery import Location, Records, create_index, plan_index, recall_at_k
from reid_engine.gallery.embedding import feature_file_contract
from reid_engine.inference import load_features

TARGET_RECALL, TARGET_P50_MS, TARGET_SPEEDUP = 0.99, 5.0, 20.0
TRAIN_CONFIG = os.path.join(REPO, "configs", "SyntheticReID", "bagtricks_R18_quick.yml")


def real_features(args) -> tuple:
    """(features, pids) of a real test split: from --features, --checkpoint, or a tiny model trained here."""
    if args.features:
        data = load_features(args.features)
        return data["features"], data["pids"]
    checkpoint, config = args.checkpoint, args.config_file or TRAIN_CONFIG
    overrides = ["DATASETS.ROOT", os.path.join(args.work_dir, "datasets"), "MODEL.DEVICE", "cpu"]
    if not checkpoint:
        checkpoint = os.path.join(args.work_dir, "train", "model_final.pth")
        if not os.path.isfile(checkpoint):
            print(f"training a tiny ResNet-18 for {args.train_epochs} epochs on SyntheticReID into {args.work_dir}")
            subprocess.run([sys.executable, os.path.join(REPO, "tools", "train_net.py"), "--config-file", config] + overrides
                           + ["OUTPUT_DIR", os.path.join(args.work_dir, "train"), "SOLVER.MAX_EPOCH", str(args.train_epochs),
                              "SOLVER.STEPS", "[1,2]", "SOLVER.WARMUP_ITERS", "20", "TEST.EVAL_PERIOD", "100",
                              "SOLVER.CHECKPOINT_PERIOD", "100"], check=True)
    cached = os.path.join(args.work_dir, "test_features.npz")
    if not os.path.isfile(cached):
        for split in ("query", "gallery"):
            subprocess.run([sys.executable, os.path.join(REPO, "tools", "extract_features.py"), "--config-file", config,
                            "--split", split, "--output", cached + f".{split}.npz", *overrides, "MODEL.WEIGHTS", checkpoint],
                           check=True)
        q, g = load_features(cached + ".query.npz"), load_features(cached + ".gallery.npz")
        np.savez(cached, features=np.concatenate([q["features"], g["features"]]), pids=np.concatenate([q["pids"], g["pids"]]))
    with np.load(cached) as data:
        return data["features"], data["pids"]


class ReidLikeGenerator:
    """New identities and images with the statistics of real ReID features (see the module docstring)."""

    def __init__(self, features: np.ndarray, pids: np.ndarray, dim: int, seed: int = 0):
        keep = pids > 0  # pid 0: distractors, no identity
        x, pids = features[keep].astype(np.float64), pids[keep]
        x = x - x.mean(0)
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        if vt.shape[0] < dim:
            raise SystemExit(f"the real features have {vt.shape[0]} principal directions, fewer than --dim {dim}")
        x = x @ vt[:dim].T
        ids, inverse, counts = np.unique(pids, return_inverse=True, return_counts=True)
        centres = np.stack([x[inverse == i].mean(0) for i in range(len(ids))])
        residual = x - centres[inverse]
        rms = np.sqrt((residual ** 2).sum(1))
        self.spreads = np.array([rms[inverse == i].mean() for i in range(len(ids))]) / rms.mean()
        self.counts = counts
        self.centre_mean = centres.mean(0)
        self.centre_factor = np.linalg.cholesky(np.cov(centres.T) + 1e-6 * np.eye(dim))
        self.within_factor = np.linalg.cholesky(np.cov(residual.T) + 1e-6 * np.eye(dim))
        self.rng = np.random.default_rng(seed)
        self.dim = dim
        self.real_ids, self.real_images = len(ids), len(x)

    def identities(self, num: int) -> tuple:
        """(centres, spreads) of `num` new identities."""
        z = self.rng.standard_normal((num, self.dim))
        return self.centre_mean + z @ self.centre_factor.T, self.rng.choice(self.spreads, num)

    def images(self, centres, spreads, pids: np.ndarray) -> np.ndarray:
        """One L2-normalized float32 image feature per entry of `pids` (indices into `centres`)."""
        out = np.empty((len(pids), self.dim), dtype=np.float32)
        for start in range(0, len(pids), 100_000):
            p = pids[start:start + 100_000]
            z = self.rng.standard_normal((len(p), self.dim)) @ self.within_factor.T
            x = centres[p] + spreads[p, None] * z
            out[start:start + len(p)] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return out

    def gallery(self, size: int, num_queries: int) -> tuple:
        """(gallery features, gallery pids, query features, query pids), queries of gallery identities."""
        num_ids = int(size / self.counts.mean()) + 1
        centres, spreads = self.identities(num_ids)
        counts = self.rng.choice(self.counts, num_ids)
        pids = np.repeat(np.arange(num_ids), counts)[:size]
        if len(pids) < size:
            pids = np.concatenate([pids, self.rng.integers(0, num_ids, size - len(pids))])
        query_pids = self.rng.choice(np.unique(pids), num_queries)
        return self.images(centres, spreads, pids), pids, self.images(centres, spreads, query_pids), query_pids


def latency(index, queries: np.ndarray, batch: int, repeats: int) -> tuple:
    """(p50 ms, p99 ms) per call and queries per second, over `repeats` calls of `batch` queries."""
    starts = iter(range(0, repeats * batch, batch))

    def one_call():
        start = next(starts) % len(queries)
        q = queries[start:start + batch]
        index.search(q if len(q) == batch else queries[:batch], 10)

    times = np.array(timed(one_call, repeats=repeats)[0])
    return float(np.percentile(times, 50) * 1e3), float(np.percentile(times, 99) * 1e3), batch / float(np.median(times))


def index_bytes(plan, size: int, dim: int) -> int:
    """The vectors and the structure an index of this plan holds (faiss' layouts): flat N d 4 (2 for fp16 lists);
    IVF adds 8-byte ids and the centroids; HNSW adds 2 M 4-byte links per item on its base level."""
    vectors = size * dim * (2 if getattr(plan, "storage", "float32") == "fp16" else 4)
    if plan.kind == "ivf":
        return vectors + size * 8 + plan.nlist * dim * 4
    if plan.kind == "hnsw":
        return vectors + size * plan.hnsw_m * 2 * 4
    return vectors


def measure(kind: str, backend: str, features, pids, queries, contract, args, exact_ids=None) -> dict:
    """Build one index and measure it (exact_ids: the exact top-10 for recall)."""
    folder = tempfile.mkdtemp(prefix="bench_gallery_")
    location = Location(os.path.join(folder, "g.rindex") if backend == "faiss" else f"bench_{kind}_{len(features)}",
                        backend, os.path.join(folder, "milvus.db"))
    records = Records.from_columns({"path": np.char.add("g", np.arange(len(features)).astype(str)), "pid": pids,
                                    "camid": np.arange(len(features)) % 6})
    rss_before = peak_rss_gb()
    with Stopwatch() as build:
        index = create_index(location, contract, len(features), kind=kind, recall_target=args.recall_target)
        index.add(features, records)
    repeats1 = args.exact_repeats if kind == "flat" else args.repeats
    p50, p99, qps1 = latency(index, queries, 1, repeats1)
    b50, b99, qps64 = latency(index, queries, 64, max(3, repeats1 // 20))
    found = np.array([np.pad(ids, (0, 10 - len(ids)), constant_values=-1)  # the top 10, -1 where fewer came back
                      for ids in index.search(queries[:args.recall_queries], 10).ids])
    row = {"size": len(features), "backend": backend, "kind": kind, "build_s": build.wall,
           "index_gb": index_bytes(index.manifest.plan, len(features), features.shape[1]) / 1e9, "peak_rss_gb": peak_rss_gb(),
           "rss_growth_gb": peak_rss_gb() - rss_before, "p50_ms": p50, "p99_ms": p99, "batch64_p50_ms_per_query": b50 / 64,
           "batch64_p99_ms_per_query": b99 / 64, "qps_batch1": qps1, "qps_batch64": qps64, "plan": index.manifest.plan.to_dict(),
           "recall@10": 1.0 if exact_ids is None else recall_at_k(found, exact_ids)}
    if backend == "milvus":
        index.client.drop_collection(index.collection)
    del index
    return row, found


def power_fit(sizes, values):
    """(a, b) of values ~ a * size^b, least squares in log-log."""
    b, log_a = np.polyfit(np.log(sizes), np.log(np.maximum(values, 1e-12)), 1)
    return float(np.exp(log_a)), float(b)


def extrapolate(rows, size: int) -> list:
    """Rows at `size` from a power-law fit of each timing and memory figure over the measured sizes."""
    out = []
    for key in sorted({(r["backend"], r["kind"]) for r in rows}):
        mine = [r for r in rows if (r["backend"], r["kind"]) == key]
        if len(mine) < 2:
            continue
        sizes = [r["size"] for r in mine]
        row = {"size": size, "backend": key[0], "kind": key[1], "extrapolated": True, "recall@10": None,
               "plan": {**mine[-1]["plan"], "nlist": plan_index(size, key[1]).nlist, "search_param": "?"}}
        for field in ("build_s", "index_gb", "p50_ms", "p99_ms", "batch64_p50_ms_per_query", "qps_batch1", "qps_batch64"):
            a, b = power_fit(sizes, [r[field] for r in mine])
            row[field] = a * size ** b
            row[field + "_exponent"] = b
        out.append(row)
    return out


def print_rows(rows) -> None:
    """The rows as a markdown table, queries per second also as a multiple of exact search."""
    exact = {r["size"]: r for r in rows if r["kind"] == "flat" and r["backend"] == "faiss"}

    def cells(r, ref, plan):
        params = {"ivf": f"nlist {plan.get('nlist')}, nprobe {plan.get('search_param')}",
                  "hnsw": f"M {plan.get('hnsw_m')}, efSearch {plan.get('search_param')}"}.get(r["kind"], "")
        return (f"{r['size']:,}" + (" (extrapolated)" if r.get("extrapolated") else ""), r["backend"], r["kind"],
                f"{r['build_s']:.1f}", f"{r['index_gb']:.2f}", f"{r.get('peak_rss_gb', float('nan')):.2f}", f"{r['p50_ms']:.2f}",
                f"{r['p99_ms']:.2f}", f"{r['batch64_p50_ms_per_query']:.3f}", f"{r['qps_batch1']:.0f}", f"{r['qps_batch64']:.0f}",
                f"{r['qps_batch1'] / ref['qps_batch1']:.1f}" if ref else "-",
                f"{r['qps_batch64'] / ref['qps_batch64']:.1f}" if ref else "-",
                "-" if r["recall@10"] is None else f"{r['recall@10']:.4f}", params)
    print_table(("size", "back end", "index", "build s", "index GB", "peak RSS GB", "p50 ms b1", "p99 ms b1",
                 "ms/query b64", "QPS b1", "QPS b64", "x exact b1", "x exact b64", "recall@10", "params"),
                (cells(r, exact.get(r["size"]), r.get("plan") or {}) for r in rows))


def plot(rows, path: str) -> None:
    """Queries per second at batch 1 and 64 against gallery size per back end and index, log-log."""
    from matplotlib.figure import Figure  # no pyplot: no GUI back end, no global figure state

    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    for ax, field in zip(axes, ("qps_batch1", "qps_batch64")):
        for key in sorted({(r["backend"], r["kind"]) for r in rows}):
            mine = sorted((r for r in rows if (r["backend"], r["kind"]) == key), key=lambda r: r["size"])
            measured = [r for r in mine if not r.get("extrapolated")]
            line, = ax.plot([r["size"] for r in measured], [r[field] for r in measured], "o-", label=" ".join(key))
            if len(mine) > len(measured):
                ax.plot([measured[-1]["size"], mine[-1]["size"]], [measured[-1][field], mine[-1][field]], "--",
                        color=line.get_color())
        ax.set(xscale="log", yscale="log", xlabel="gallery size (dashed: extrapolated)",
               ylabel=f"queries per second, batch {field[-2:].lstrip('h')}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("reid-index: top-10 search on ReID-like 256-d features, 2 faiss threads (shared machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2, help="faiss threads (default 2: the target machine)")
    parser.add_argument("--features", default="", help="a reid-extract file of a test split (with pids)")
    parser.add_argument("--checkpoint", default="", help="a checkpoint to embed SyntheticReID's test split with")
    parser.add_argument("--config-file", default="", help="its config (default: the quick SyntheticReID R18)")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "bench_gallery"))
    parser.add_argument("--train-epochs", type=int, default=2)
    parser.add_argument("--recall-target", type=float, default=TARGET_RECALL)
    parser.add_argument("--queries", type=int, default=1000, help="held-out queries (recall, latency)")
    parser.add_argument("--recall-queries", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=300, help="batch-1 searches timed per approximate index")
    parser.add_argument("--exact-repeats", type=int, default=40, help="batch-1 searches timed for exact search")
    parser.add_argument("--hnsw-max", type=int, default=100_000, help="also measure HNSW up to this size")
    parser.add_argument("--milvus-max", type=int, default=100_000, help="also measure Milvus Lite up to this size")
    parser.add_argument("--extrapolate", type=int, default=10_000_000)
    parser.add_argument("--output", default="", help="write the rows as JSON here")
    parser.add_argument("--plot", default="", help="draw QPS against gallery size into this PNG")
    parser.add_argument("--replot", default="", help="only draw --plot from the JSON of an earlier run")
    args = parser.parse_args(argv)
    if args.replot:
        with open(args.replot, encoding="utf-8") as f:
            plot(json.load(f), args.plot or "bench_gallery.png")
        return 0

    import faiss

    faiss.omp_set_num_threads(args.threads)
    os.makedirs(args.work_dir, exist_ok=True)
    feats, pids = real_features(args)
    generator = ReidLikeGenerator(feats, pids, args.dim)
    print(f"statistics of {generator.real_images} real features of {generator.real_ids} identities "
          f"(images per identity {generator.counts.min()}..{generator.counts.max()}, spread "
          f"{generator.spreads.min():.2f}..{generator.spreads.max():.2f} x the mean), {args.dim} principal directions;"
          f" faiss on {args.threads} threads; load average {os.getloadavg()[0]:.1f}")
    rows = []
    for size in args.sizes:
        features, gpids, queries, _ = generator.gallery(size, args.queries)
        contract = feature_file_contract(features, "bench").to_dict()
        exact, exact_ids = measure("flat", "faiss", features, gpids, queries, contract, args)
        rows.append(exact)
        kinds = [("ivf", "faiss")] + ([("hnsw", "faiss")] if size <= args.hnsw_max else []) + (
            [("flat", "milvus"), ("ivf", "milvus")] if size <= args.milvus_max else [])
        for kind, backend in kinds:
            row, _ = measure(kind, backend, features, gpids, queries, contract, args, exact_ids[:args.recall_queries])
            rows.append(row)
            print(f"  {size:,} {backend} {kind}: build {row['build_s']:.1f} s, p50 {row['p50_ms']:.2f} ms, "
                  f"recall@10 {row['recall@10']:.4f}", flush=True)
        del features, queries
    rows += extrapolate([r for r in rows if r["backend"] == "faiss"], args.extrapolate)
    print_rows(rows)
    largest = {(r["kind"], r["backend"]): r for r in rows if r["size"] == max(args.sizes) and not r.get("extrapolated")}
    if ("ivf", "faiss") in largest and ("flat", "faiss") in largest:
        b, e = largest["ivf", "faiss"], largest["flat", "faiss"]
        print(f"targets at {b['size']:,}: recall@10 {b['recall@10']:.4f} (>= {TARGET_RECALL}: {b['recall@10'] >= TARGET_RECALL}),"
              f" p50 {b['p50_ms']:.2f} ms (<= {TARGET_P50_MS}: {b['p50_ms'] <= TARGET_P50_MS}), QPS x exact "
              f"{b['qps_batch1'] / e['qps_batch1']:.1f} at batch 1 and {b['qps_batch64'] / e['qps_batch64']:.1f} at batch 64 "
              f"(>= {TARGET_SPEEDUP})")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1, default=float)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
