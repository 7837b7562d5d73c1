"""CMC, mAP and mINP exactly as reid-protocol.md defines them, chunk by chunk.

Nothing here sorts a query x gallery row. Only the *ranks of the true matches*
matter for CMC, AP and INP, and the rank of the t-th match (matches ordered by
distance, ties by gallery index) is t plus the number of negatives before it. So per
block of queries: sort the few matches of each row, give every gallery item that
can precede the last match a bucket (how many matches precede it) with one
``searchsorted``, histogram the buckets, and a cumulative sum gives every rank.
For any useful model the items before the last match are a small part of the
gallery, so they are packed into a narrow block first. Exact distance ties with a
match are moved to their stable (gallery index) position afterwards. Memory is one
``chunk x gallery`` block plus per-item buckets; work is a few cheap passes over the
block, so computing the distances stays the dominant cost.

Per-query AP / INP / first-match ranks are stored and reduced once at the end, so
results do not depend on the chunk size (bit for bit on CPU).
"""
import logging
from typing import Optional, Tuple

import numpy as np
import torch

from ..utils.errors import ReidUserError
from .distance import all_finite, as_feature_tensor, default_chunk_size, iter_distance_chunks
from .matching import GalleryIdIndex, as_id_tensor

__all__ = ["RankAccumulator", "evaluate_rank", "evaluate_rank_from_features", "NoValidQueryError"]

logger = logging.getLogger(__name__)

# CUHK03 single-gallery-shot: how many random gallery draws are averaged.
CUHK03_REPEATS = 10


class NoValidQueryError(ReidUserError, ValueError):
    """Raised when no query has a true match (same pid, other camera) in the gallery."""


# Candidate fraction above which ranking works on the full block instead of a packed one.
COMPACT_MAX_FRACTION = 0.25


def _compact_candidates(dist: torch.Tensor, bound: torch.Tensor):
    """Items with ``dist <= bound`` of each row, packed left into a (C, K) block.

    Args:
        dist: (C, G) distances.
        bound: (C, 1) per-row bound.

    Returns:
        (values, cols): the packed distances (padding +inf) and their gallery indices
        (padding -1); or ``(dist, None)`` when packing is not worth it.
    """
    within = dist <= bound
    count = int(torch.count_nonzero(within))
    if count > COMPACT_MAX_FRACTION * dist.numel():  # packing would save little
        return dist, None
    rows, cols = within.nonzero(as_tuple=True)
    per_row = torch.bincount(rows, minlength=dist.shape[0])
    width = int(per_row.max()) if count else 0
    slot = torch.arange(count, device=dist.device) - (torch.cumsum(per_row, 0) - per_row)[rows]
    values = torch.full((dist.shape[0], width), float("inf"), dtype=dist.dtype, device=dist.device)
    packed_cols = torch.full((dist.shape[0], width), -1, dtype=torch.int64, device=dist.device)
    values[rows, slot] = dist[rows, cols]
    packed_cols[rows, slot] = cols
    return values, packed_cols


class RankAccumulator:
    """Consumes distance blocks (query rows x whole gallery) and returns CMC / mAP / mINP.

    Usage: ``acc.update(start_row, dist_block)`` for every block in any order, then
    ``acc.summarize()``.
    """

    def __init__(self, q_pids, g_pids, q_camids, g_camids, max_rank: int = 50,
                 use_cuhk03: bool = False, cuhk03_seed: int = 0):
        """
        Args:
            q_pids, g_pids, q_camids, g_camids: identities and camera ids (sequences,
                numpy arrays or tensors).
            max_rank: length of the CMC curve.
            use_cuhk03: CUHK03 classic single-gallery-shot CMC (AP still on the full list).
            cuhk03_seed: seed of the single-gallery-shot draws (query i uses seed + i).
        """
        if max_rank < 1:
            raise ValueError(f"max_rank must be >= 1, got {max_rank}")
        self.q_pids = as_id_tensor(q_pids, "q_pids")
        self.q_camids = as_id_tensor(q_camids, "q_camids", len(self.q_pids))
        self.g_pids = as_id_tensor(g_pids, "g_pids")
        self.g_camids = as_id_tensor(g_camids, "g_camids", len(self.g_pids))
        self.num_query, self.num_gallery = len(self.q_pids), len(self.g_pids)
        self.max_rank = int(max_rank)
        self.use_cuhk03 = use_cuhk03
        self.cuhk03_seed = int(cuhk03_seed)
        self.index = GalleryIdIndex(self.g_pids, self.g_camids)
        self._device_ids = {}
        num = self.num_query
        self.num_pos = torch.zeros(num, dtype=torch.int64)
        self.first_rank = torch.zeros(num, dtype=torch.int64)
        self.last_rank = torch.zeros(num, dtype=torch.int64)
        self.ap = torch.zeros(num, dtype=torch.float64)
        self.seen = torch.zeros(num, dtype=torch.bool)
        # CUHK03: per query, how many of the draws had the match at rank <= k.
        self.sgs_hits = torch.zeros(num, self.max_rank, dtype=torch.int64) if use_cuhk03 else None
        self._pid_slot = torch.unique(self.g_pids, return_inverse=True)[1] if use_cuhk03 else None

    def _ids_on(self, device: torch.device):
        """Gallery pids / camids on `device`, cached."""
        key = str(device)
        if key not in self._device_ids:
            self._device_ids[key] = (self.g_pids.to(device), self.g_camids.to(device))
        return self._device_ids[key]

    def update(self, start: int, dist: torch.Tensor) -> None:
        """Add the metrics of query rows ``start .. start + len(dist)``.

        Args:
            start: index of the block's first query.
            dist: (C, G) distances of those queries to the whole gallery.
        """
        num_rows = dist.shape[0]
        if dist.dim() != 2 or dist.shape[1] != self.num_gallery or start < 0 or start + num_rows > self.num_query:
            raise ValueError(
                f"distance block of shape {tuple(dist.shape)} at row {start} does not fit "
                f"{self.num_query} queries x {self.num_gallery} gallery items"
            )
        if not all_finite(dist):
            raise ValueError(f"distances for queries {start}..{start + num_rows - 1} contain NaN or inf; "
                             "check the features or distance matrix")
        rows = slice(start, start + num_rows)
        q_pids, q_camids = self.q_pids[rows], self.q_camids[rows]
        matched = self.index.lookup(q_pids, q_camids)
        num_pos = matched.positive.sum(1)
        width = int(num_pos.max()) if num_rows else 0
        ranks = torch.zeros(num_rows, width, dtype=torch.int64)
        if width > 0:
            ranks = self._positive_ranks(dist, q_pids, matched, width)
        valid_t = torch.arange(width).unsqueeze(0) < num_pos.unsqueeze(1)
        pos_rows = torch.arange(num_rows).unsqueeze(1).expand(-1, width)[valid_t]
        nth = torch.arange(width).unsqueeze(0).expand(num_rows, -1)[valid_t]
        pos_rank = ranks[valid_t]
        # index_add_ on CPU adds in order, so a row's AP does not depend on the chunking.
        ap_sum = torch.zeros(num_rows, dtype=torch.float64)
        ap_sum.index_add_(0, pos_rows, (nth + 1).double() / (pos_rank + 1).double())
        last = ranks.gather(1, (num_pos - 1).clamp_min(0).unsqueeze(1)).squeeze(1) if width else num_pos

        self.num_pos[rows] = num_pos
        self.ap[rows] = ap_sum / num_pos.clamp_min(1).double()
        self.first_rank[rows] = ranks[:, 0] if width else num_pos
        self.last_rank[rows] = last
        self.seen[rows] = True
        if self.use_cuhk03:
            self._update_single_gallery_shot(start, dist, q_pids, q_camids)

    def _positive_ranks(self, dist: torch.Tensor, q_pids: torch.Tensor, matched, width: int) -> torch.Tensor:
        """0-based rank of each true match among the kept gallery items, per query row.

        With the positives of a row sorted by (distance, index), a negative n precedes
        the t-th positive iff fewer than t + 1 positives come before n; so
        rank_t = t + #{negatives n : bucket(n) <= t} with bucket(n) = #positives before n.
        Buckets come from one ``searchsorted`` per element plus a histogram; the rare
        exact distance ties with a positive are then moved to their stable position.

        Returns:
            torch.Tensor: (C, width) int64 on CPU; entries past a row's positives are unused.
        """
        device = dist.device
        num_rows = dist.shape[0]
        cols = matched.cols.to(device)
        matched_dist = dist.gather(1, cols)
        inf = torch.tensor(float("inf"), dtype=dist.dtype, device=device)
        num_pos = matched.positive.sum(1).to(device).unsqueeze(1)
        # Positives sorted by (distance, gallery index): cols ascend within a row and the sort is stable.
        pos_sorted, order = torch.sort(torch.where(matched.positive.to(device), matched_dist, inf), dim=1, stable=True)
        # A trailing +inf column makes every bucket (<= width) a valid index into pos_dist.
        pos_dist = torch.cat([pos_sorted[:, :width], inf.expand(num_rows, 1)], dim=1)
        pos_cols = cols.gather(1, order[:, :width])

        # Only items up to the row's last positive can precede a positive; when they are
        # few (any useful model), rank just those, compacted into a (C, K) block.
        last_pos = pos_sorted.gather(1, (num_pos - 1).clamp_min(0))
        last_pos = torch.where(num_pos > 0, last_pos, -inf)
        values, value_cols = _compact_candidates(dist, last_pos)

        # bucket(n) = #positives with a strictly smaller distance (ties fixed below).
        bucket = torch.searchsorted(pos_dist, values)
        hist = torch.zeros(num_rows, width + 1, dtype=torch.int64, device=device)
        hist.scatter_add_(1, bucket, torch.ones(1, 1, dtype=torch.int64, device=device).expand_as(bucket))
        # Items with the query's pid (positives and junk) are not negatives: take them out.
        # (Compacted-away items and padding land in bucket num_pos, which no rank reads.)
        matched_bucket = torch.searchsorted(pos_dist, matched_dist.contiguous())
        hist.scatter_add_(1, matched_bucket, -matched.valid.to(device=device, dtype=torch.int64))

        # Exact ties with a positive: a negative with a smaller gallery index comes first.
        tie = values == pos_dist.gather(1, bucket)
        if value_cols is not None:
            tie &= value_cols >= 0  # padding (+inf) "ties" with the +inf column
        tie_rows, tie_slots = tie.nonzero(as_tuple=True)
        tie_cols = value_cols[tie_rows, tie_slots] if value_cols is not None else tie_slots
        g_pids, _ = self._ids_on(device)
        negative = g_pids[tie_cols] != q_pids.to(device)[tie_rows]
        tie_rows, tie_slots, tie_cols = tie_rows[negative], tie_slots[negative], tie_cols[negative]
        if tie_rows.numel():
            tie_dist = values[tie_rows, tie_slots]
            tie_bucket = bucket[tie_rows, tie_slots]
            later = (pos_dist[tie_rows, :width] == tie_dist.unsqueeze(1)) & (pos_cols[tie_rows] < tie_cols.unsqueeze(1))
            shift = later.sum(1)
            flat = hist.view(-1)
            flat.index_add_(0, tie_rows * (width + 1) + tie_bucket, -torch.ones_like(shift))
            flat.index_add_(0, tie_rows * (width + 1) + tie_bucket + shift, torch.ones_like(shift))
        negatives_before = torch.cumsum(hist, 1)[:, :width]
        return (negatives_before + torch.arange(width, device=device)).cpu()

    def _update_single_gallery_shot(self, start: int, dist: torch.Tensor, q_pids, q_camids) -> None:
        """CUHK03 classic CMC: one random gallery image per pid, CUHK03_REPEATS draws."""
        device = dist.device
        g_pids, g_camids = self._ids_on(device)
        pid_slot = self._pid_slot.to(device)
        num_slots = int(pid_slot.max()) + 1 if pid_slot.numel() else 0
        cols = torch.arange(self.num_gallery, device=device)
        ranks = torch.arange(self.max_rank, device=device)
        for i in range(dist.shape[0]):
            row = dist[i]
            same_pid = g_pids == int(q_pids[i])
            junk = same_pid & (g_camids == int(q_camids[i]))
            if not bool((same_pid & ~junk).any()):
                continue
            gen = torch.Generator().manual_seed(self.cuhk03_seed + start + i)
            for _ in range(CUHK03_REPEATS):
                # A random permutation value per item; the largest of each pid is its draw.
                key = torch.randperm(self.num_gallery, generator=gen).to(device)
                key = torch.where(junk, torch.full_like(key, -1), key)
                best = torch.full((num_slots,), -1, dtype=key.dtype, device=device)
                best.scatter_reduce_(0, pid_slot, key, "amax")
                chosen = (key == best[pid_slot]) & ~junk
                pos_col = int((chosen & same_pid).nonzero()[0, 0])
                pos_d = row[pos_col]
                before = chosen & ((row < pos_d) | ((row == pos_d) & (cols < pos_col)))
                rank = int(before.sum())
                self.sgs_hits[start + i] += (ranks >= rank).cpu().to(torch.int64)

    def summarize(self) -> Tuple[np.ndarray, float, float]:
        """Return ``(cmc, mAP, mINP)`` as fractions over the queries with a valid match.

        Raises:
            NoValidQueryError: when no query has a valid match.
        """
        if not bool(self.seen.all()):
            missing = int((~self.seen).sum())
            raise RuntimeError(f"{missing} query rows were never given to RankAccumulator.update")
        valid = self.num_pos > 0
        num_valid = int(valid.sum())
        skipped = self.num_query - num_valid
        if num_valid == 0:
            raise NoValidQueryError(
                f"none of the {self.num_query} queries has a valid match (same id, different camera) "
                "in the gallery; the usual cause is that all images share one camera id - check the camids"
            )
        if skipped:
            logger.info("%d of %d queries have no valid match in the gallery and are skipped", skipped, self.num_query)
        if self.use_cuhk03:
            hits = self.sgs_hits[valid].sum(0).double()
            cmc = hits / (num_valid * CUHK03_REPEATS)
        else:
            first = self.first_rank[valid].clamp_max(self.max_rank)
            hits = torch.bincount(first, minlength=self.max_rank + 1)[: self.max_rank]
            cmc = torch.cumsum(hits, 0).double() / num_valid
        mean_ap = float(self.ap[valid].sum() / num_valid)
        inp = self.num_pos[valid].double() / (self.last_rank[valid] + 1).double()
        mean_inp = float(inp.sum() / num_valid)
        return cmc.numpy(), mean_ap, mean_inp


def evaluate_rank(distmat, q_pids, g_pids, q_camids, g_camids, max_rank: int = 50,
                  use_cuhk03: bool = False, chunk_size: Optional[int] = None) -> Tuple[np.ndarray, float, float]:
    """Rank metrics from a query x gallery distance matrix (smaller = more similar).

    Args:
        distmat: (Q, G) numpy array or tensor (any device); read one block of rows at a time.
        q_pids, g_pids, q_camids, g_camids: identities and camera ids.
        max_rank: CMC length.
        use_cuhk03: CUHK03 classic single-gallery-shot CMC.
        chunk_size: query rows per block (default: about 16M distances per block).

    Returns:
        (cmc, mAP, mINP): cmc a float64 numpy array of length max_rank; all fractions.
    """
    dist = torch.from_numpy(distmat) if isinstance(distmat, np.ndarray) else distmat
    if not isinstance(dist, torch.Tensor) or dist.dim() != 2:
        raise ValueError(f"distmat must be a 2-D array or tensor, got {getattr(distmat, 'shape', type(distmat))}")
    acc = RankAccumulator(q_pids, g_pids, q_camids, g_camids, max_rank, use_cuhk03)
    if acc.num_query != dist.shape[0] or acc.num_gallery != dist.shape[1]:
        raise ValueError(
            f"distmat has shape {tuple(dist.shape)} but there are {acc.num_query} query and "
            f"{acc.num_gallery} gallery ids"
        )
    if not dist.is_floating_point():
        dist = dist.double()
    chunk = chunk_size or default_chunk_size(dist.shape[1])
    for start in range(0, dist.shape[0], chunk):
        acc.update(start, dist[start:start + chunk])
    return acc.summarize()


def evaluate_rank_from_features(qf, gf, q_pids, g_pids, q_camids, g_camids, metric: str = "cosine",
                                max_rank: int = 50, use_cuhk03: bool = False,
                                chunk_size: Optional[int] = None) -> Tuple[np.ndarray, float, float]:
    """Rank metrics straight from features, never building the full distance matrix.

    Args:
        qf, gf: (Q, D) and (G, D) features (tensors on any device, or numpy).
        q_pids, g_pids, q_camids, g_camids: identities and camera ids.
        metric: "cosine" or "euclidean".
        max_rank: CMC length.
        use_cuhk03: CUHK03 classic single-gallery-shot CMC.
        chunk_size: query rows per block.

    Returns:
        (cmc, mAP, mINP) as :func:`evaluate_rank`.
    """
    qf = as_feature_tensor(qf, "query features")
    acc = RankAccumulator(q_pids, g_pids, q_camids, g_camids, max_rank, use_cuhk03)
    if acc.num_query != qf.shape[0] or acc.num_gallery != gf.shape[0]:
        raise ValueError(
            f"{qf.shape[0]} query / {gf.shape[0]} gallery features but "
            f"{acc.num_query} query / {acc.num_gallery} gallery ids"
        )
    for start, dist in iter_distance_chunks(qf, gf, metric, chunk_size):
        acc.update(start, dist)
    return acc.summarize()
