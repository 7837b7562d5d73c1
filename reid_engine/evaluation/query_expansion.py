"""Alpha query expansion (AQE), as reid-protocol.md defines it.

For QE_TIME rounds, every feature (query and gallery) becomes the L2-normalised sum
of its QE_K nearest gallery features, itself included, each weighted by
similarity ** ALPHA. "Itself included" is taken literally: the item always counts
as its own first neighbour (weight 1 ** ALPHA = 1) and the other QE_K - 1 are the
most similar gallery features other than itself. Features are L2-normalised first
(similarity = cosine); similarities are clamped at 0 before the power so that a
fractional ALPHA stays defined. Rows are processed in chunks, so memory is one
``chunk x gallery`` similarity block.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .distance import as_feature_tensor, default_chunk_size

__all__ = ["alpha_query_expansion"]


def _expand_rows(rows: torch.Tensor, gallery: torch.Tensor, self_index: Optional[torch.Tensor],
                 qe_k: int, alpha: float) -> torch.Tensor:
    """Expanded (unnormalised) features of `rows` (normalised) against the normalised `gallery`.

    Args:
        rows: (C, D) normalised features being expanded.
        gallery: (G, D) normalised gallery features.
        self_index: (C,) gallery index of each row when the rows are gallery items
            (excluded from the neighbour search, since the row counts itself), else None.
        qe_k: neighbours including the item itself.
        alpha: similarity exponent.
    """
    sims = rows @ gallery.t()
    if self_index is not None:
        sims[torch.arange(rows.shape[0], device=rows.device), self_index] = float("-inf")
    others = min(qe_k - 1, gallery.shape[0] - (1 if self_index is not None else 0))
    expanded = rows.clone()  # the item itself, weight 1
    if others > 0:
        top_sims, top_idx = torch.topk(sims, others, dim=1)
        weights = top_sims.clamp_min(0).pow(alpha)
        expanded += torch.einsum("ck,ckd->cd", weights, gallery[top_idx])
    return expanded


def alpha_query_expansion(query, gallery, qe_time: int = 1, qe_k: int = 5, alpha: float = 3.0,
                          chunk_size: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Apply alpha query expansion to query and gallery features.

    Args:
        query: (Q, D) features (tensor or numpy).
        gallery: (G, D) features on the same device.
        qe_time: number of rounds (TEST.AQE.QE_TIME).
        qe_k: neighbours per item, itself included (TEST.AQE.QE_K).
        alpha: similarity exponent (TEST.AQE.ALPHA).
        chunk_size: rows per similarity block.

    Returns:
        (query, gallery): expanded, L2-normalised float32 features.
    """
    if qe_time < 0 or qe_k < 1:
        raise ValueError(f"AQE needs QE_TIME >= 0 and QE_K >= 1, got QE_TIME={qe_time}, QE_K={qe_k} (TEST.AQE)")
    q = F.normalize(as_feature_tensor(query, "query features").float(), dim=1)
    g = F.normalize(as_feature_tensor(gallery, "gallery features").float().to(q.device), dim=1)
    chunk = chunk_size or default_chunk_size(g.shape[0])
    for _ in range(qe_time):
        new_q = torch.cat([_expand_rows(q[s:s + chunk], g, None, qe_k, alpha)
                           for s in range(0, q.shape[0], chunk)] or [q[:0]])
        new_g = torch.cat([
            _expand_rows(g[s:s + chunk], g, torch.arange(s, min(s + chunk, g.shape[0]), device=g.device), qe_k, alpha)
            for s in range(0, g.shape[0], chunk)] or [g[:0]])
        q, g = F.normalize(new_q, dim=1), F.normalize(new_g, dim=1)
    return q, g
