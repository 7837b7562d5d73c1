"""Pairwise CosFace loss (large margin cosine loss over pairs of samples)."""
import torch
from torch.nn import functional as F

from .pairwise import cosine_similarity_matrix, identity_masks, masked_logsumexp

__all__ = ["pairwise_cosface_loss"]


def pairwise_cosface_loss(embedding: torch.Tensor, targets: torch.Tensor, margin: float,
                          gamma: float) -> torch.Tensor:
    """CosFace over all pairs in the batch.

    Per anchor ``softplus(LSE_p(-gamma * s_p) + LSE_n(gamma * (s_n + m)))``, where ``s`` are
    cosine similarities to the anchor's positives (itself excluded) and negatives.

    Args:
        embedding: (B, D) features.
        targets: (B,) identity labels.
        margin: additive cosine margin m on the negatives.
        gamma: scale factor.

    Returns:
        Tensor: scalar loss (mean over anchors).
    """
    sim = cosine_similarity_matrix(embedding)
    is_pos, is_neg = identity_masks(targets, exclude_self=True)
    logit_p = -gamma * sim
    logit_n = gamma * (sim + margin)
    return F.softplus(masked_logsumexp(logit_p, is_pos) + masked_logsumexp(logit_n, is_neg)).mean()
