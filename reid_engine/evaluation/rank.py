"""CMC, mAP and mINP exactly as reid-protocol.md defines them, chunk by chunk.

No query x gallery row is argsorted. Only the *ranks of the true matches*
matter for CMC, AP and INP: the rank of a match is the number of kept gallery items
that come before it in the (distance, gallery index) order. Per block of queries:

1. the row's farthest true match bounds the *candidates*: only items with
   ``dist <= bound`` can precede a match (one compare pass over the block; junk
   items, same pid and camera, are dropped from the candidates there);
2. every candidate gets one int64 key (row, distance, gallery index) - the distance
   as its order-preserving IEEE bits (float32 or narrower, or float64 holding float32
   values), else as its dense rank among the candidates - and the keys are sorted;
3. a match's rank is where its own key lands in the sorted keys (one ``searchsorted``
   per match, not per item) minus the start of its row.

Why this formulation (measured on a 2-core AVX2 EPYC, Market size, see
tools/benchmarks/bench_rank_vs_fastreid.py): the keys are unique and totally ordered,
so exact ties need no special case, and the only per-item work is a few flat passes:
compare, flatnonzero, key packing and one 1-D sort. On CPU the full-block passes and
the sort run in numpy (single-threaded SIMD loops and sort, 2-7x torch's on one
thread) and the small rest of torch's work on one thread: a second OpenMP thread gained
little quiet and lost most beside one busy process (the former per-item ``searchsorted``
formulation: 0.69 s quiet, 1.6 s loaded; this one about 0.17 s either way).
For any useful model the candidates are a small part of the gallery; a useless one
(every item a candidate) costs about one flat sort of the block.
Memory is the ``chunk x gallery`` block, a boolean mask of it and the keys of at most
MAX_CANDIDATES candidates at a time.

Per-query AP / INP / first-match ranks are stored and reduced once at the end, so
results do not depend on the chunk size (bit for bit on CPU).
"""
import contextlib
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


# Most candidates keyed and sorted at once (rows are grouped below it). It bounds the
# memory of the keys (about 40 bytes per candidate, temporaries included), and groups
# this small keep those temporaries in cache: with a random model on Market (every item
# a candidate) 1.7 s against 2.5 s with 2**21.
MAX_CANDIDATES = 1 << 17
# Bits of a distance code in a key; (row, code, gallery index) must fit 63 bits.
_CODE_BITS = 32


@contextlib.contextmanager
def _one_cpu_thread(device: torch.device):
    """Run torch CPU ops on one thread inside the block (no-op on other devices).

    What is left to torch here is small or memory-bound: a second thread gains little
    on a quiet machine, while on a busy one every parallel op waits for the thread
    that shares its core with another process.
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _float_bits(values: torch.Tensor) -> torch.Tensor:
    """Order-preserving integers in [0, 2**32) of float32 (or narrower) values; -0.0 and 0.0 equal."""
    raw = (values.float() + 0.0).view(torch.int32)  # "+ 0.0" turns -0.0 into 0.0
    # Negative floats order reversed as signed integers: flip their magnitude bits.
    return torch.where(raw < 0, raw ^ 0x7FFFFFFF, raw).to(torch.int64) + (1 << 31)


def _order_codes(values: torch.Tensor, queries: torch.Tensor):
    """Integer codes in [0, 2**32) that order `values` and `queries` as their distances.

    Equal distances get equal codes (-0.0 and 0.0 included). Float32 and narrower (and
    float64 holding float32 values) use the order-preserving IEEE bits; other float64
    values their dense rank among `values`, so a query that is not among `values` gets
    the code of the next larger one.

    Args:
        values: (N,) candidate distances.
        queries: any shape, distances whose codes are needed too (the matches).

    Returns:
        (codes of values, codes of queries): int64 tensors.
    """
    exact = values.element_size() <= 4 or all(bool((x.float().double() == x).all()) for x in (values, queries))
    if exact:
        return _float_bits(values), _float_bits(queries)
    if values.device.type == "cpu":  # numpy's SIMD sort, as in _sorted
        uniq = torch.from_numpy(np.unique(values.numpy()))
    else:
        uniq = torch.unique(values)
    return torch.searchsorted(uniq, values), torch.searchsorted(uniq, queries.contiguous())


def _sorted(keys: torch.Tensor) -> torch.Tensor:
    """1-D `keys` sorted ascending: numpy's SIMD sort on CPU (2-7x torch's there), else torch."""
    if keys.device.type == "cpu":
        return torch.from_numpy(np.sort(keys.numpy()))
    return torch.sort(keys).values


# dtypes whose CPU candidate search runs in numpy (bfloat16 has no numpy dtype).
_NUMPY_DTYPES = (torch.float16, torch.float32, torch.float64)


def _candidate_groups(dist: torch.Tensor, bound: torch.Tensor, junk_rows: torch.Tensor, junk_cols: torch.Tensor):
    """The candidates of a block, ``dist <= bound`` less the junk items, by groups of rows.

    Groups hold at most MAX_CANDIDATES candidates (a row is never split) and few enough
    rows for (row, code, gallery index) keys to fit 63 bits; for any useful model the
    whole block is one group.

    Args:
        dist: (C, G) distances.
        bound: (C, 1) per-row bound.
        junk_rows, junk_cols: positions of the junk items.

    Yields:
        (first row, end row, flat): ``flat`` the row-major indices (int64 tensor on
        dist's device) of the candidates in ``dist[first:end]``, ascending.
    """
    if dist.device.type == "cpu" and dist.dtype in _NUMPY_DTYPES:
        # numpy's compare, count and flatnonzero are single-threaded SIMD loops: on a
        # Market-size block 3-6x faster than torch's on one thread (and no thread to wait for).
        mask = dist.detach().numpy() <= bound.numpy()
        mask[junk_rows.numpy(), junk_cols.numpy()] = False
        count, flat_nonzero, as_tensor = np.count_nonzero, np.flatnonzero, torch.from_numpy
    else:
        mask = dist <= bound
        mask[junk_rows, junk_cols] = False
        count, as_tensor = torch.count_nonzero, (lambda flat: flat)

        def flat_nonzero(block):
            return block.reshape(-1).nonzero().squeeze(1)
    num_rows, num_gallery = mask.shape
    max_rows = 1 << (63 - _CODE_BITS - _col_bits(num_gallery))
    if num_rows <= max_rows and int(count(mask)) <= MAX_CANDIDATES:
        yield 0, num_rows, as_tensor(flat_nonzero(mask))
        return
    ends = torch.cumsum(torch.as_tensor(count(mask, 1)).cpu(), 0)
    first = 0
    while first < num_rows:
        before = int(ends[first - 1]) if first else 0
        end = int(torch.searchsorted(ends, before + MAX_CANDIDATES, right=True))
        end = min(max(end, first + 1), first + max_rows, num_rows)
        yield first, end, as_tensor(flat_nonzero(mask[first:end]))
        first = end


def _col_bits(num_gallery: int) -> int:
    """Bits of a gallery index in a key."""
    return max(1, (num_gallery - 1).bit_length())


def _pack_keys(rows: torch.Tensor, codes: torch.Tensor, cols: torch.Tensor, col_bits: int) -> torch.Tensor:
    """int64 keys ordered as (row, distance code, gallery index)."""
    return (rows << (_CODE_BITS + col_bits)) | (codes << col_bits) | cols


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
        with _one_cpu_thread(dist.device):
            self._add_block(start, dist)

    def _add_block(self, start: int, dist: torch.Tensor) -> None:
        """:meth:`update` on a block of the right shape."""
        num_rows = dist.shape[0]
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
            ranks = self._positive_ranks(dist, matched, width)
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

    def _positive_ranks(self, dist: torch.Tensor, matched, width: int) -> torch.Tensor:
        """0-based rank of each true match among the kept gallery items, per query row.

        The rank of a match is the number of candidates (kept items with ``dist`` at
        most the row's farthest match) whose (distance, gallery index) key is smaller:
        its position in the sorted keys of its row.

        Returns:
            torch.Tensor: (C, width) int64 on CPU, ascending per row; entries past a
            row's matches are unused.
        """
        device = dist.device
        num_rows, num_gallery = dist.shape
        cols = matched.cols.to(device)
        positive = matched.positive.to(device)
        matched_dist = dist.gather(1, cols)
        bound = torch.where(positive, matched_dist, float("-inf")).amax(1, keepdim=True)
        junk_rows, junk_slots = matched.junk.to(device).nonzero(as_tuple=True)
        col_bits = _col_bits(num_gallery)
        ranks = torch.full(cols.shape, num_gallery, dtype=torch.int64, device=device)
        groups = _candidate_groups(dist, bound, junk_rows, cols[junk_rows, junk_slots])
        for first, end, flat in groups:  # rows without a true match (bound -inf) have no candidates
            rows = flat // num_gallery
            codes, match_codes = _order_codes(torch.take(dist[first:end], flat), matched_dist[first:end])
            keys = _sorted(_pack_keys(rows, codes, flat - rows * num_gallery, col_bits))
            local = torch.arange(end - first, device=device).unsqueeze(1).expand_as(match_codes)
            match_keys = _pack_keys(local, match_codes, cols[first:end], col_bits)
            counts = torch.bincount(rows, minlength=end - first)
            rank = torch.searchsorted(keys, match_keys) - (torch.cumsum(counts, 0) - counts).unsqueeze(1)
            ranks[first:end] = torch.where(positive[first:end], rank, ranks[first:end])
        return torch.sort(ranks, dim=1).values[:, :width].cpu()

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
