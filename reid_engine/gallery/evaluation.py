"""Evaluation through the index: mAP / CMC from its (exact) search, and the approximate index's recall@k.

The distance matrix is rebuilt from the index's answers (every item of each query's
ranking, with the distance the index returned) and scored by the evaluator's
`evaluation.rank.evaluate_rank`, so the figures agree with `DatasetEvaluator` on the same
features up to float rounding of the distances.
"""
from typing import Dict

import numpy as np

from ..evaluation.rank import evaluate_rank
from .index import GalleryIndex
from .planner import recall_at_k

__all__ = ["evaluate_with_index", "approximate_recall"]


def evaluate_with_index(index: GalleryIndex, query_features: np.ndarray, q_pids, q_camids, max_rank: int = 50,
                        exact: bool = True) -> Dict[str, object]:
    """Rank metrics of queries against the whole index, from the index's own search.

    Returns:
        {"cmc": (max_rank,) array, "mAP": float, "mINP": float} as fractions.
    """
    n = len(index)
    result = index.search(query_features, n, exact=exact)
    distmat = np.full((len(query_features), n), np.inf, dtype=np.float32)
    for row, (ids, dist) in enumerate(zip(result.ids, result.distances)):
        distmat[row, ids] = dist
    gallery = index.records(np.arange(n))
    cmc, mean_ap, minp = evaluate_rank(distmat, np.asarray(q_pids), gallery.pid, np.asarray(q_camids), gallery.camid,
                                       max_rank=min(max_rank, n))
    return {"cmc": cmc, "mAP": float(mean_ap), "mINP": float(minp)}


def approximate_recall(index: GalleryIndex, queries: np.ndarray, k: int = 10) -> float:
    """recall@k of the index's (approximate) search against exact search over the same items."""
    approx = index.search(queries, k).ids
    exact = index.search(queries, k, exact=True).ids
    pad = lambda rows: np.array([np.pad(r, (0, k - len(r)), constant_values=-1) for r in rows])  # noqa: E731
    return recall_at_k(pad(approx), pad(exact))
