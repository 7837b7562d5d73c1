"""Searching an index: queries in (images, feature files), top-k out, optionally re-ranked, as JSON and pictures.

Re-ranking is the evaluation's k-reciprocal re-ranking (`evaluation.rerank`) applied to each
query and the candidates the index returned (`rerank_candidates` of them), so it costs a
few milliseconds at any gallery size; the top-k of the re-ranked distances are returned.
"""
import os
from typing import List, Optional, Sequence

import numpy as np

from ..evaluation.rerank import k_reciprocal_rerank
from ..inference.rank_figures import draw_rank_list
from ..utils.errors import UsageError, require_module
from .filters import SearchFilter
from .index import GalleryIndex, SearchResult
from .records import Records

__all__ = ["DEFAULT_RERANK_CANDIDATES", "search_index", "rerank_result", "draw_results"]

DEFAULT_RERANK_CANDIDATES = 100


def search_index(index: GalleryIndex, queries: np.ndarray, k: int = 10,
                 filters: Optional[Sequence[SearchFilter]] = None, rerank: bool = False,
                 rerank_candidates: int = DEFAULT_RERANK_CANDIDATES, exact: bool = False) -> SearchResult:
    """Top-`k` hits per query row, each under its filter, k-reciprocal re-ranked on request.

    Args:
        index: the index; queries: (Q, D) features of the index's model.
        k: hits per query; filters: one per query (or None).
        rerank: re-rank the `rerank_candidates` best candidates of each query.
        exact: exact search on an approximate index.
    """
    if k < 1:
        raise UsageError(f"--topk must be at least 1, got {k}")
    if not rerank:
        return index.search(queries, k, filters, exact=exact)
    result = index.search(queries, max(k, rerank_candidates), filters, exact=exact)
    return rerank_result(index, queries, result, k)


def rerank_result(index: GalleryIndex, queries: np.ndarray, result: SearchResult, k: int) -> SearchResult:
    """Re-rank each query's candidates by k-reciprocal distance (k1, k2 bounded by the candidate count)."""
    ids, dists, recs = [], [], []
    for query, cand in zip(queries, result.ids):
        if len(cand) < 2:
            ids.append(cand[:k]), dists.append(np.zeros(len(cand[:k]), np.float32)), recs.append(index.records(cand[:k]))
            continue
        k1 = min(20, len(cand) - 1)
        k2 = max(1, min(6, k1))
        dist = k_reciprocal_rerank(query[None], index.vectors(cand), k1=k1, k2=k2).numpy()[0]
        order = np.argsort(dist, kind="stable")[:k]
        ids.append(cand[order]), dists.append(dist[order].astype(np.float32)), recs.append(index.records(cand[order]))
    return SearchResult(ids=ids, distances=dists, records=recs)


def draw_results(folder: str, result: SearchResult, queries: Records, names: List[str]) -> List[str]:
    """One rank-list PNG per query (the picture `reid-visualize` draws): the query, then its hits (grey
    borders where an identity is unknown, green / red for the same / another identity)."""
    require_module("matplotlib", "rank-list pictures (--vis-dir)")
    os.makedirs(folder, exist_ok=True)
    written = []
    for q, (name, recs, dist) in enumerate(zip(names, result.records, result.distances)):
        hits = [recs.item(r) for r in range(len(recs))]
        title = f"query {os.path.basename(name)}: top {len(hits)} of the index (cosine distance)"
        path = os.path.join(folder, f"search_q{q:04d}.png")
        written.append(draw_rank_list(path, queries.item(q), hits, list(range(len(hits))), dist, title))
    return written
