"""Which faiss index a gallery gets: exact for small galleries, IVF above, tuned to a recall target.

Measured on ReID-like 256-d features (tools/benchmarks/bench_gallery.py, docs/search.md):
below `EXACT_MAX_ITEMS` a flat (exact) index answers a query in a few ms on 2 cores, so
nothing approximate is needed; above it an inverted-file index with half-precision lists
(faiss' IVF with an fp16 scalar quantizer, about 8 sqrt(N) lists) reaches recall@10 >= 0.99
while scanning a few percent of the gallery. Its `nprobe` is not guessed: `calibrate`
searches a sample of the gallery's own items (each one's own row left out) with growing
`nprobe` until the recall@k against exact search reaches the target (with a margin).
HNSW is available by name (``kind="hnsw"``), tuned the same way through ``efSearch``; at
1M items it needed efSearch 4096 for recall@10 0.99 on these features (15 ms a query)
after a build 5x IVF's, which is why "auto" does not pick it.
"""
import math
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np

from ..utils.errors import UsageError

__all__ = ["INDEX_KINDS", "EXACT_MAX_ITEMS", "DEFAULT_RECALL_TARGET", "IndexPlan", "plan_index", "calibrate",
           "recall_at_k"]

INDEX_KINDS = ("auto", "flat", "ivf", "hnsw")
EXACT_MAX_ITEMS = 50_000
DEFAULT_RECALL_TARGET = 0.99
CALIBRATION_QUERIES = 500
#: IVF lists per sqrt(N): at 1M items 8 sqrt(N) lists cut the batch-1 p50 of 4 sqrt(N) by a third (4.1 ms
#: against 6.1 ms at recall@10 0.995) for a 3.5x longer build (166 s against 47 s; bench_gallery, 2 shared cores)
IVF_LISTS_PER_SQRT = 8
CALIBRATION_K = 10
#: the sample aims this fraction of the way from the target to 1 (0.995 for 0.99): on held-out queries the
#: recall measured came out up to 0.003 below the sample's (bench_gallery), so the bare target undershoots
CALIBRATION_MARGIN = 0.5


@dataclass
class IndexPlan:
    """An index kind with its parameters (`search_param`: nprobe for IVF, efSearch for HNSW)."""

    kind: str
    recall_target: float = DEFAULT_RECALL_TARGET
    requested: str = "auto"
    nlist: int = 0
    hnsw_m: int = 0
    ef_construction: int = 0
    search_param: int = 0
    calibrated_recall: Optional[float] = None
    storage: str = "float32"

    def to_dict(self) -> dict:
        """The plan as a JSON-ready dict (what `info` shows)."""
        return asdict(self)


def plan_index(num_items: int, kind: str = "auto", recall_target: float = DEFAULT_RECALL_TARGET) -> IndexPlan:
    """The index for a gallery of `num_items` (search parameters are set later by `calibrate`).

    Args:
        num_items: gallery size.
        kind: "auto" (flat up to EXACT_MAX_ITEMS, else ivf), or "flat", "ivf", "hnsw".
        recall_target: recall@10 against exact search the approximate index must reach.
    """
    if kind not in INDEX_KINDS:
        raise UsageError(f"unknown index kind {kind!r} (--index-type): use one of {', '.join(INDEX_KINDS)}")
    if not 0.0 < recall_target <= 1.0:
        raise UsageError(f"--recall-target {recall_target} must be in (0, 1]: e.g. 0.99")
    requested = kind
    if kind == "auto":
        kind = "flat" if num_items <= EXACT_MAX_ITEMS or recall_target >= 1.0 else "ivf"
    if kind == "ivf":
        # IVF_LISTS_PER_SQRT sqrt(N) lists, and at least 39 training points per list (faiss' k-means warns below)
        nlist = max(1, min(int(IVF_LISTS_PER_SQRT * math.sqrt(max(num_items, 1))), num_items // 39))
        return IndexPlan("ivf", recall_target, requested, nlist=nlist, storage="fp16")
    if kind == "hnsw":
        return IndexPlan("hnsw", recall_target, requested, hnsw_m=32, ef_construction=80)
    return IndexPlan("flat", recall_target, requested)


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Mean over queries of |approximate top-k ∩ exact top-k| / k (rows of ids, -1 = empty)."""
    hits = [len(set(a[a >= 0]) & set(e[e >= 0])) / max(1, int((e >= 0).sum())) for a, e in zip(approx_ids, exact_ids)]
    return float(np.mean(hits)) if hits else 1.0


def calibrate(plan: IndexPlan, search: Callable[[np.ndarray, int, int], np.ndarray],
              exact_search: Callable[[np.ndarray, int], np.ndarray], vectors: np.ndarray, rows: np.ndarray,
              max_param: int) -> IndexPlan:
    """Set the smallest search parameter that reaches the recall target (nprobe for IVF, efSearch for HNSW).

    The parameter doubles (from 1 for IVF, 16 for HNSW) until the recall@10 of the sample
    reaches the target plus `CALIBRATION_MARGIN` of the rest, then a bisection between the last two values narrows it to within
    an eighth: the cost of a query grows about linearly with it, so overshooting by up to 2x
    would cost up to 2x in latency.

    Args:
        plan: an "ivf" or "hnsw" plan (changed in place and returned).
        search: ``search(queries, k, param) -> ids`` of the approximate index.
        exact_search: ``exact_search(queries, k) -> ids`` of exact search over the same items.
        vectors: the sample's query vectors; rows: their own ids (left out of both result lists).
        max_param: the largest value worth trying (nlist for IVF).
    """
    k = CALIBRATION_K
    exact = _without_self(exact_search(vectors, k + 1), rows, k)
    goal = min(1.0, plan.recall_target + CALIBRATION_MARGIN * (1.0 - plan.recall_target))

    def recall(param: int) -> float:
        return recall_at_k(_without_self(search(vectors, k + 1, param), rows, k), exact)

    low, high = 0, 1 if plan.kind == "ivf" else 16
    best = recall(high)
    while best < goal and high < max_param:
        low, high = high, min(high * 2, max_param)
        best = recall(high)
    while best >= goal and high - low > max(1, high // 8):
        middle = (low + high) // 2
        reached = recall(middle)
        if reached >= goal:
            high, best = middle, reached
        else:
            low = middle
    plan.search_param, plan.calibrated_recall = high, round(best, 5)
    return plan


def _without_self(ids: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    out = np.full((len(ids), k), -1, dtype=np.int64)
    for i, (row, own) in enumerate(zip(ids, rows)):
        kept = row[(row != own) & (row >= 0)][:k]
        out[i, :len(kept)] = kept
    return out
