"""Which gallery items share a query's identity, found without a dense Q x G mask.

The gallery is grouped by pid once (a CSR-like index); for a block of queries the
gallery items with the same pid are then looked up directly. Identities own few
gallery images, so this is a small (C, M) table instead of a (C, G) comparison.
"""
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["as_id_tensor", "GalleryIdIndex", "MatchedItems"]


def as_id_tensor(ids, name: str, length: int = None) -> torch.Tensor:
    """Return pids or camids (sequence, numpy array or tensor) as a 1-D int64 CPU tensor.

    Args:
        ids: the identifiers.
        name: used in error messages.
        length: expected length, checked when given.

    Returns:
        torch.Tensor: (N,) int64.
    """
    if isinstance(ids, torch.Tensor):
        t = ids.detach().cpu()
    else:
        t = torch.as_tensor(np.asarray(ids))
    if t.dim() != 1:
        t = t.reshape(-1)
    if t.is_floating_point() and t.numel() and not bool((t == t.round()).all()):
        raise ValueError(f"{name} must be integers, got non-integral values")
    t = t.to(torch.int64)
    if length is not None and t.numel() != length:
        raise ValueError(f"{name} has {t.numel()} entries but the distance matrix / features have {length}")
    return t


@dataclass
class MatchedItems:
    """Gallery items with the query's pid, for a block of C queries (padded to M columns).

    Attributes:
        cols: (C, M) int64 gallery indices, ascending within a row (padding repeats a valid index).
        valid: (C, M) bool, False on padding.
        positive: (C, M) bool, same pid and a different camera (a true match).
        junk: (C, M) bool, same pid and the same camera (dropped by the protocol).
    """

    cols: torch.Tensor
    valid: torch.Tensor
    positive: torch.Tensor
    junk: torch.Tensor


class GalleryIdIndex:
    """Gallery pids and camids grouped by pid for fast per-query lookup."""

    def __init__(self, g_pids: torch.Tensor, g_camids: torch.Tensor):
        """
        Args:
            g_pids, g_camids: (G,) int64 tensors.
        """
        self.num_gallery = int(g_pids.numel())
        self.g_camids = g_camids
        # Stable sort: items of one pid stay in ascending gallery order.
        order = torch.sort(g_pids, stable=True).indices
        self.order = order
        self.unique_pids, counts = torch.unique_consecutive(g_pids[order], return_counts=True)
        self.counts = counts
        self.starts = torch.cumsum(counts, 0) - counts

    def count_matches(self, q_pids: torch.Tensor) -> torch.Tensor:
        """Return, for each query, the number of gallery items with its pid (junk included)."""
        if self.unique_pids.numel() == 0:
            return torch.zeros_like(q_pids)
        pos = torch.searchsorted(self.unique_pids, q_pids).clamp_max(self.unique_pids.numel() - 1)
        found = self.unique_pids[pos] == q_pids
        return torch.where(found, self.counts[pos], torch.zeros_like(pos))

    def lookup(self, q_pids: torch.Tensor, q_camids: torch.Tensor) -> MatchedItems:
        """Return the gallery items sharing each query's pid.

        Args:
            q_pids, q_camids: (C,) int64 CPU tensors.

        Returns:
            MatchedItems: CPU tensors.
        """
        num = q_pids.numel()
        if self.unique_pids.numel() == 0 or num == 0:
            empty = torch.zeros(num, 0, dtype=torch.int64)
            flag = torch.zeros(num, 0, dtype=torch.bool)
            return MatchedItems(empty, flag, flag, flag)
        pos = torch.searchsorted(self.unique_pids, q_pids).clamp_max(self.unique_pids.numel() - 1)
        found = self.unique_pids[pos] == q_pids
        counts = torch.where(found, self.counts[pos], torch.zeros_like(pos))
        width = int(counts.max()) if num else 0
        offsets = torch.arange(width, dtype=torch.int64)
        valid = offsets.unsqueeze(0) < counts.unsqueeze(1)
        flat = (self.starts[pos].unsqueeze(1) + offsets.unsqueeze(0)).clamp_max(self.num_gallery - 1)
        cols = self.order[flat]
        # Padding points at a real item (harmless); `valid` masks it out.
        same_cam = self.g_camids[cols] == q_camids.unsqueeze(1)
        return MatchedItems(cols=cols, valid=valid, positive=valid & ~same_cam, junk=valid & same_cam)
