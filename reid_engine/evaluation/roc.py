"""True positive rate at fixed false positive rates over all valid query-gallery pairs.

Pairs (reid-protocol.md): positives = same pid, different camera; negatives =
different pid; same-pid-same-camera pairs are excluded. A pair is accepted when its
distance is below a threshold t. TPR@FPR=f is the best TPR over thresholds whose FPR
is <= f: with m = floor(f * #negatives), t may go up to (not including) the
(m + 1)-th smallest negative distance v, so TPR = #positives with distance < v / #positives.

Only the positives (few per query) and the smallest ``floor(max f * #negatives) + 1``
negative distances are kept, streamed block by block with a shrinking threshold.
"""
from fractions import Fraction
from typing import Dict, Sequence

import torch

from .matching import GalleryIdIndex, as_id_tensor

__all__ = ["RocAccumulator", "DEFAULT_FPRS", "roc_key"]

DEFAULT_FPRS = (1e-4, 1e-3, 1e-2)


def roc_key(fpr: float) -> str:
    """Result name of a TPR at `fpr`, fast-reid's spelling: ``TPR@FPR=1e-04``."""
    return "TPR@FPR={:.0e}".format(fpr)


class RocAccumulator:
    """Consumes distance blocks (query rows x whole gallery) and returns TPR at FPR targets."""

    def __init__(self, q_pids, g_pids, q_camids, g_camids, fprs: Sequence[float] = DEFAULT_FPRS):
        """
        Args:
            q_pids, g_pids, q_camids, g_camids: identities and camera ids.
            fprs: false positive rates in (0, 1].
        """
        if not fprs or any(not 0 < f <= 1 for f in fprs):
            raise ValueError(f"FPR targets must lie in (0, 1], got {list(fprs)}")
        self.fprs = tuple(fprs)
        self.q_pids = as_id_tensor(q_pids, "q_pids")
        self.q_camids = as_id_tensor(q_camids, "q_camids", len(self.q_pids))
        g_pids = as_id_tensor(g_pids, "g_pids")
        self.g_pids = g_pids
        self.index = GalleryIdIndex(g_pids, as_id_tensor(g_camids, "g_camids", len(g_pids)))
        matched = int(self.index.count_matches(self.q_pids).sum())
        self.num_negatives = len(self.q_pids) * len(g_pids) - matched
        # The (m + 1)-th smallest negative for the largest target is the deepest one needed.
        self.keep = min(self.num_negatives, self._num_below(max(self.fprs)) + 1)
        self.smallest = torch.empty(0)
        self.positives = []

    def _num_below(self, fpr: float) -> int:
        """floor(fpr * #negatives), exact (no float rounding)."""
        return int(Fraction(repr(float(fpr))) * self.num_negatives)

    def update(self, start: int, dist: torch.Tensor) -> None:
        """Add the pairs of query rows ``start .. start + len(dist)``.

        Args:
            start: index of the block's first query.
            dist: (C, G) distances of those queries to the whole gallery.
        """
        rows = slice(start, start + dist.shape[0])
        matched = self.index.lookup(self.q_pids[rows], self.q_camids[rows])
        device = dist.device
        cols = matched.cols.to(device)
        if cols.shape[1]:
            self.positives.append(dist.gather(1, cols)[matched.positive.to(device)].double().cpu())
        if self.keep == 0:
            return
        same_pid = torch.zeros(dist.shape, dtype=torch.bool, device=device)
        valid_rows, valid_slots = matched.valid.nonzero(as_tuple=True)
        same_pid[valid_rows.to(device), cols[valid_rows.to(device), valid_slots.to(device)]] = True
        candidates = ~same_pid
        if self.smallest.numel() >= self.keep:
            # Only values below the current keep-th smallest can still matter.
            bound = torch.kthvalue(self.smallest, self.keep).values
            candidates &= dist < bound.to(device=device, dtype=dist.dtype)
        values = dist[candidates].double().cpu()
        merged = torch.cat([self.smallest, values])
        if merged.numel() > self.keep:
            bound = torch.kthvalue(merged, self.keep).values
            merged = merged[merged <= bound]  # ties at the bound are kept; see module docstring
        self.smallest = merged

    def summarize(self) -> Dict[float, float]:
        """Return ``{fpr: tpr}`` (fractions). TPR is NaN when there are no positive pairs."""
        positives = torch.cat(self.positives) if self.positives else torch.empty(0, dtype=torch.float64)
        smallest = torch.sort(self.smallest).values
        results = {}
        for fpr in self.fprs:
            m = self._num_below(fpr)
            bound = smallest[m] if m < smallest.numel() else torch.tensor(float("inf"), dtype=torch.float64)
            if positives.numel() == 0:
                results[fpr] = float("nan")
            else:
                results[fpr] = float((positives < bound).sum()) / positives.numel()
        return results
