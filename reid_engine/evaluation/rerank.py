"""k-reciprocal re-ranking (Zhong et al., CVPR 2017), the steps of reid-protocol.md.

Exact, in torch (CPU or GPU), and without dense N x N matrices. Every step only
needs a short list per item, so the pool is handled as:

- one streamed pass of ``chunk x N`` distance blocks: each row's maximum and, from the
  same block, the k1 + 1 nearest items of the row (dividing a row by its own maximum
  keeps its order; ties broken by index, like every ranking in this package);
- k-reciprocal sets, their expansion, V and its local expansion as sparse rows
  (at most (k1 + 1) * (round(k1 / 2) + 2) entries per row before the expansion);
- the Jaccard distance through an inverted index (only item pairs that share a
  non-zero column of V are visited), one block of query rows at a time.

Peak memory is a distance block, the sparse V rows, and one ``chunk x gallery``
output block (see tools/benchmarks/bench_evaluation.py for measured figures).
:func:`iter_jaccard_distance` runs the same steps on one pool compared with itself (the
Jaccard distance that pseudo-labelling clusters, see ``reid_engine.clustering``).
Distances are those of the evaluation metric: "euclidean" is the squared L2
distance; "cosine" (1 - cos) equals half the squared L2 distance of normalised
features, which the row normalisation of step 1 makes identical.

Step 1 divides each row of the pool's distance matrix by that row's maximum, as the
original implementation does (it divides by the column maxima and transposes the
symmetric matrix) and as fast-reid's ``re_ranking`` does. Scaling columns instead would
change every item's own neighbour order.
"""
import logging
from typing import Iterator, Optional, Tuple

import torch

from .distance import as_feature_tensor, default_chunk_size, distance_chunk, prepare_gallery

__all__ = ["iter_rerank_chunks", "k_reciprocal_rerank", "iter_jaccard_distance"]

logger = logging.getLogger(__name__)

# Item pairs visited per block of the Jaccard step (bounds its temporary memory).
_JACCARD_PAIRS = 1 << 23


def _stable_nearest(dist: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k smallest entries of each row, ordered by (distance, index).

    topk alone may pick any of several equal values at the boundary; rows where that
    matters are completed with the lowest-index ties.
    """
    values, idx = torch.topk(dist, k, dim=1, largest=False, sorted=True)
    boundary = values[:, -1:]
    needed = (values == boundary).sum(1)  # how many boundary ties the row keeps
    available = (dist == boundary).sum(1)
    for row in (available > needed).nonzero().flatten().tolist():
        smaller = idx[row][values[row] < boundary[row]]
        ties = (dist[row] == boundary[row]).nonzero().flatten()[: int(needed[row])]
        idx[row] = torch.cat([smaller, ties])
    idx = torch.sort(idx, dim=1).values  # index order, then a stable sort by distance
    order = torch.sort(dist.gather(1, idx), dim=1, stable=True).indices
    return idx.gather(1, order)


def _nearest_normalised(dist: torch.Tensor, row_max: torch.Tensor, k: int) -> torch.Tensor:
    """``_stable_nearest(dist / row_max[:, None], k)`` without dividing the whole block.

    Division by a positive row constant keeps the order of a row but can merge nearly equal
    values into ties. So the k + 1 smallest raw values are normalised: where the (k+1)-th
    normalised value is above the k-th, the first k are exactly the row's k nearest, and only
    they need ordering by (normalised distance, index); the other rows (a tie at the boundary)
    take the exact path.
    """
    n = dist.shape[1]
    if k >= n:
        return _stable_nearest(dist / row_max[:, None], k)
    values, idx = torch.topk(dist, k + 1, dim=1, largest=False, sorted=True)
    exact = (values[:, k - 1] / row_max == values[:, k] / row_max).nonzero().flatten()
    idx = torch.sort(idx[:, :k], dim=1).values  # index order, then a stable sort by distance
    order = torch.sort(dist.gather(1, idx) / row_max[:, None], dim=1, stable=True).indices
    idx = idx.gather(1, order)
    if exact.numel():
        idx[exact] = _stable_nearest(dist.index_select(0, exact) / row_max[exact, None], k)
    return idx


def _reciprocal(neighbours: torch.Tensor, k: int, chunk: int) -> torch.Tensor:
    """Mask of R(p, k) within the first k + 1 neighbours: g in N(p) and p in N(g)."""
    nb = neighbours[:, : k + 1]
    masks = []
    for s in range(0, nb.shape[0], chunk):
        rows = torch.arange(s, min(s + chunk, nb.shape[0]), device=nb.device)
        masks.append((nb[nb[rows]] == rows.view(-1, 1, 1)).any(-1))
    return torch.cat(masks)


def _sparse_rows_unique(rows: torch.Tensor, cols: torch.Tensor, n: int, values: Optional[torch.Tensor] = None):
    """Merge duplicate (row, col) entries (summing values); returns sorted rows, cols, values."""
    keys, inverse = torch.unique(rows * n + cols, return_inverse=True)
    if values is None:
        return keys // n, keys % n, None
    summed = torch.zeros(keys.numel(), dtype=values.dtype, device=values.device).index_add_(0, inverse, values)
    return keys // n, keys % n, summed


def _pair_distances(feats: torch.Tensor, term: torch.Tensor, row_max: torch.Tensor, rows: torch.Tensor,
                    cols: torch.Tensor, metric: str, chunk: int = 1 << 13) -> torch.Tensor:
    """Row-normalised distances d(rows[i], cols[i]) / max_j d(rows[i], j) for a list of pairs, in blocks."""
    out = torch.empty(rows.numel(), dtype=torch.float32, device=feats.device)
    for s in range(0, rows.numel(), chunk):
        r, c = rows[s:s + chunk], cols[s:s + chunk]
        # index_select and one fused dot: advanced indexing and a product then a sum cost ~1.3x on the CPU
        dot = torch.linalg.vecdot(feats.index_select(0, r).float(), feats.index_select(0, c).float())
        if metric == "cosine":
            d = 1.0 - dot * term[r] * term[c]
        else:
            d = (term[r] + term[c] - 2.0 * dot).clamp_min(0.0)
        out[s:s + chunk] = d / row_max[r]
    return out


def _build_v(feats, term, row_max, neighbours, k1: int, k2: int, metric: str, chunk: int):
    """Steps 2-5: k-reciprocal sets, expansion, V rows and local query expansion (sparse COO)."""
    n = neighbours.shape[0]
    device = neighbours.device
    k1 = min(k1, n - 1)
    half = min(int(round(k1 / 2.0)), n - 1)  # Python rounds halves to even, like numpy.around
    recip = _reciprocal(neighbours, k1, chunk)          # (N, k1 + 1)
    recip_half = _reciprocal(neighbours, half, chunk)   # (N, half + 1)
    nb = neighbours[:, : k1 + 1]
    nb_half = neighbours[:, : half + 1]
    rows_out, cols_out = [], []
    for s in range(0, n, chunk):
        rows = torch.arange(s, min(s + chunk, n), device=device)
        members = torch.where(recip[rows], nb[rows], torch.full_like(nb[rows], -1))  # R(p), -1 = absent
        cand = nb_half[nb[rows]]                    # (C, k1+1, half+1): N(q, half) for q in N(p)
        cand_mask = recip_half[nb[rows]]            # ... restricted to R(q, half)
        inside = (cand.unsqueeze(-1) == members.unsqueeze(1).unsqueeze(1)).any(-1) & cand_mask
        size = cand_mask.sum(-1)
        accept = (inside.sum(-1) * 3 > 2 * size) & recip[rows]  # |R_half(q) & R(p)| > 2/3 |R_half(q)|
        add = cand_mask & accept.unsqueeze(-1)
        r_idx = rows.view(-1, 1).expand_as(members)
        rows_out += [r_idx[recip[rows]], rows.view(-1, 1, 1).expand_as(cand)[add]]
        cols_out += [nb[rows][recip[rows]], cand[add]]
    v_rows, v_cols, _ = _sparse_rows_unique(torch.cat(rows_out), torch.cat(cols_out), n)
    weights = torch.exp(-_pair_distances(feats, term, row_max, v_rows, v_cols, metric))
    row_sum = torch.zeros(n, dtype=weights.dtype, device=device).index_add_(0, v_rows, weights)
    v_vals = weights / row_sum[v_rows]
    # Step 5: V[p] <- mean of V[q] over the k2 nearest q of p.
    k2 = min(k2, n)
    counts = torch.bincount(v_rows, minlength=n)
    starts = torch.cumsum(counts, 0) - counts
    source = neighbours[:, :k2].reshape(-1)                  # q for every (p, j)
    target = torch.arange(n, device=device).repeat_interleave(k2)
    lengths = counts[source]
    entry = torch.repeat_interleave(starts[source], lengths)
    entry += torch.arange(entry.numel(), device=device) - torch.repeat_interleave(
        torch.cumsum(lengths, 0) - lengths, lengths)
    qe_rows = torch.repeat_interleave(target, lengths)
    return _sparse_rows_unique(qe_rows, v_cols[entry], n, v_vals[entry] / k2)


def _jaccard_block(q_rows, q_cols, q_vals, g_index, num_rows: int, first_row: int, num_gallery: int, q_sum, g_sum,
                   pairs: bool = False):
    """Jaccard distances of a block of query rows to every gallery item (step 6).

    Returns the dense (rows, gallery) block, or with ``pairs`` only the pairs that share a
    column of V (the others are at distance 1) as ``(rows, cols, distances)``, row-major.
    """
    col_start, col_count, g_items, g_vals = g_index
    device = q_vals.device
    lengths = col_count[q_cols]
    # One repeat (the V entry each visited pair comes from), then gathers: cheaper than a repeat per quantity.
    # index_select, not x[idx]: advanced indexing is several times slower on the CPU.
    source = torch.repeat_interleave(torch.arange(q_cols.numel(), device=device), lengths)
    entry = torch.arange(source.numel(), device=device)
    entry += (col_start[q_cols] - (torch.cumsum(lengths, 0) - lengths)).index_select(0, source)  # within its column
    mins = torch.minimum(q_vals.index_select(0, source), g_vals.index_select(0, entry))
    target = ((q_rows - first_row) * num_gallery).index_select(0, source).add_(g_items.index_select(0, entry))
    inter = torch.zeros(num_rows * num_gallery, dtype=q_vals.dtype, device=device)
    inter.index_add_(0, target, mins)
    inter = inter.view(num_rows, num_gallery)
    if pairs:
        rows, cols = inter.nonzero(as_tuple=True)
        shared = inter[rows, cols]
        return rows, cols, 1.0 - shared / (q_sum[rows] + g_sum[cols] - shared)
    union = (q_sum.unsqueeze(1) + g_sum.unsqueeze(0)).sub_(inter)  # sum(max) = sum(a) + sum(b) - sum(min)
    return inter.div_(union).neg_().add_(1.0)  # 1 - inter / union, in place


def _pool_v(feats: torch.Tensor, k1: int, k2: int, metric: str, chunk: int):
    """Steps 1-5 on a pool: its distance terms, row maxima and the sparse V rows (after the local expansion).

    One streamed pass of ``chunk x N`` distance blocks gives each row's maximum (step 1) and,
    from the same block, the row's k1 + 1 nearest items under the normalised distance
    (ranking the normalised values keeps float ties exactly as step 1 makes them).

    Returns:
        (feats_t, term, row_max, v_rows, v_cols, v_vals): the transposed pool and its
        distance term (:func:`prepare_gallery`), the (N,) row maxima, and V as sorted COO.
    """
    n = feats.shape[0]
    feats_t, term = prepare_gallery(feats, metric)
    k_near = min(max(k1, k2 - 1) + 1, n)
    maxima, nearest = [], []
    for s in range(0, n, chunk):
        block = distance_chunk(feats[s:s + chunk], feats_t, term, metric)
        block_max = block.amax(1).float()
        block_max = torch.where(block_max > 0, block_max, torch.ones_like(block_max))  # an item equal to the whole pool
        maxima.append(block_max)
        nearest.append(_nearest_normalised(block, block_max, k_near))
    row_max, neighbours = torch.cat(maxima), torch.cat(nearest)
    logger.info("re-ranking: neighbour lists of %d items ready", n)
    v_rows, v_cols, v_vals = _build_v(feats, term, row_max, neighbours, k1, k2, metric, chunk)
    return feats_t, term, row_max, v_rows, v_cols, v_vals


def _iter_jaccard(v_rows, v_cols, v_vals, num_query: int, gallery_offset: int, num_items: int, max_rows: int,
                  pairs: bool = False):
    """Yield ``(start, stop, jaccard)``: Jaccard distances of query rows ``[start, stop)`` to every gallery item.

    ``jaccard`` is a dense block, or with ``pairs`` the ``(rows, cols, distances)`` of
    :func:`_jaccard_block` (rows relative to ``start``).

    The query items are the V rows ``< num_query``; the gallery items the rows
    ``>= gallery_offset`` (0 when the pool is compared with itself). A block holds at
    most ``max_rows`` rows and visits at most ~_JACCARD_PAIRS item pairs.
    """
    device = v_vals.device
    num_gallery = num_items - gallery_offset
    # Inverted index of the gallery rows of V (column -> gallery items).
    is_gallery = v_rows >= gallery_offset
    g_cols, g_items, g_vals = v_cols[is_gallery], v_rows[is_gallery] - gallery_offset, v_vals[is_gallery]
    order = torch.sort(g_cols, stable=True).indices
    g_cols, g_items, g_vals = g_cols[order], g_items[order], g_vals[order]
    col_count = torch.bincount(g_cols, minlength=num_items)
    g_index = (torch.cumsum(col_count, 0) - col_count, col_count, g_items, g_vals)
    row_sum = torch.zeros(num_items, dtype=v_vals.dtype, device=device).index_add_(0, v_rows, v_vals)
    g_sum = row_sum[gallery_offset:]

    # Query rows of V, split so a block visits at most ~_JACCARD_PAIRS item pairs.
    is_query = v_rows < num_query
    q_rows, q_cols, q_vals = v_rows[is_query], v_cols[is_query], v_vals[is_query]
    q_bounds = torch.searchsorted(q_rows, torch.arange(num_query + 1, device=device))
    pairs_per_row = torch.zeros(num_query, dtype=torch.int64, device=device).index_add_(0, q_rows, col_count[q_cols])
    start = 0
    while start < num_query:
        budget = torch.cumsum(pairs_per_row[start:start + max_rows], 0)
        stop = start + max(1, int((budget <= _JACCARD_PAIRS).sum()))
        lo, hi = int(q_bounds[start]), int(q_bounds[stop])
        yield start, stop, _jaccard_block(q_rows[lo:hi], q_cols[lo:hi], q_vals[lo:hi], g_index, stop - start, start,
                                          num_gallery, row_sum[start:stop], g_sum, pairs)
        start = stop


def iter_rerank_chunks(query, gallery, k1: int = 20, k2: int = 6, lambda_value: float = 0.3,
                       metric: str = "cosine", chunk_size: Optional[int] = None) -> Iterator[Tuple[int, torch.Tensor]]:
    """Yield ``(start_row, final_distances)`` blocks of the re-ranked query x gallery matrix.

    Args:
        query, gallery: (Q, D) and (G, D) features (tensors on any device, or numpy).
        k1, k2, lambda_value: TEST.RERANK.K1 / K2 / LAMBDA.
        metric: base distance, "cosine" or "euclidean" (squared L2).
        chunk_size: rows per distance block.

    Yields:
        (int, torch.Tensor): first query row and its (C, G) float32 re-ranked distances.
    """
    if k1 < 1 or k2 < 1 or not 0.0 <= lambda_value <= 1.0:
        raise ValueError(f"re-ranking needs K1 >= 1, K2 >= 1 and 0 <= LAMBDA <= 1, got {k1}, {k2}, {lambda_value} (TEST.RERANK)")
    q = as_feature_tensor(query, "query features")
    g = as_feature_tensor(gallery, "gallery features").to(device=q.device, dtype=q.dtype)
    num_query, num_gallery = q.shape[0], g.shape[0]
    feats = torch.cat([q, g])
    n = feats.shape[0]
    chunk = chunk_size or default_chunk_size(n)
    feats_t, term, row_max, v_rows, v_cols, v_vals = _pool_v(feats, k1, k2, metric, chunk)
    gallery_t, gallery_term = feats_t[:, num_query:], term[num_query:]
    out_rows = max(1, min(chunk, default_chunk_size(num_gallery)))
    for start, stop, jaccard in _iter_jaccard(v_rows, v_cols, v_vals, num_query, num_query, n, out_rows):
        original = distance_chunk(feats[start:stop], gallery_t, gallery_term, metric) / row_max[start:stop, None]
        yield start, jaccard.mul_(1.0 - lambda_value).add_(original, alpha=lambda_value)


def iter_jaccard_distance(features, k1: int = 20, k2: int = 6, metric: str = "cosine",
                          chunk_size: Optional[int] = None, *, pairs: bool = False) -> Iterator[Tuple[int, object]]:
    """Yield blocks of the k-reciprocal Jaccard distance of a pool to itself, one block of rows at a time.

    The Jaccard term of re-ranking (steps 1-6, the same machinery and bounded memory as
    :func:`iter_rerank_chunks`) with every item both query and gallery: what
    pseudo-labelling clusters (issue 26). Pairs that share no entry of V are at distance 1.

    Args:
        features: (N, D) features (tensor on any device, or numpy).
        k1, k2: the k-reciprocal set size and the local expansion size.
        metric: base distance, "cosine" or "euclidean" (squared L2).
        chunk_size: rows per distance block (default: about 2^24 elements per block).
        pairs: yield only the pairs closer than 1 (sparse) instead of dense blocks; it
            skips the dense arithmetic over every pair, most of the work on a large pool.

    Yields:
        ``(start_row, jaccard)``: the (C, N) float32 distances of rows ``start_row ...``; with
        ``pairs``, ``(start_row, (rows, cols, distances))``, rows relative to ``start_row``,
        in row-major order (the diagonal, at 0, included).
    """
    if k1 < 1 or k2 < 1:
        raise ValueError(f"k-reciprocal Jaccard distances need k1 >= 1 and k2 >= 1, got {k1}, {k2}")
    feats = as_feature_tensor(features, "features")
    n = feats.shape[0]
    chunk = chunk_size or default_chunk_size(n)
    _, _, _, v_rows, v_cols, v_vals = _pool_v(feats, k1, k2, metric, chunk)
    max_rows = max(1, min(chunk, default_chunk_size(n)))
    for start, _, jaccard in _iter_jaccard(v_rows, v_cols, v_vals, n, 0, n, max_rows, pairs):
        yield start, jaccard


def k_reciprocal_rerank(query, gallery, k1: int = 20, k2: int = 6, lambda_value: float = 0.3,
                        metric: str = "cosine", chunk_size: Optional[int] = None) -> torch.Tensor:
    """Return the full (Q, G) re-ranked distance matrix (see :func:`iter_rerank_chunks`)."""
    blocks = [d for _, d in iter_rerank_chunks(query, gallery, k1, k2, lambda_value, metric, chunk_size)]
    if not blocks:
        return torch.empty(0, as_feature_tensor(gallery, "gallery features").shape[0])
    return torch.cat(blocks)
