"""Pairwise circle loss (Sun et al., "Circle Loss", CVPR 2020) on cosine similarities."""
import torch
from torch.nn import functional as F

from .pairwise import cosine_similarity_matrix, identity_masks, masked_logsumexp

__all__ = ["pairwise_circle_loss"]


def pairwise_circle_loss(embedding: torch.Tensor, targets: torch.Tensor, margin: float,
                         gamma: float) -> torch.Tensor:
    """Circle loss over all pairs in the batch.

    Per anchor ``softplus(LSE_p(-gamma * a_p * (s_p - (1 - m))) + LSE_n(gamma * a_n * (s_n - m)))``
    with ``a_p = relu(1 + m - s_p)`` and ``a_n = relu(s_n + m)`` (detached), where ``s`` are
    cosine similarities to the anchor's positives (itself excluded) and negatives.

    Args:
        embedding: (B, D) features.
        targets: (B,) identity labels.
        margin: relaxation m.
        gamma: scale factor.

    Returns:
        Tensor: scalar loss (mean over anchors).
    """
    sim = cosine_similarity_matrix(embedding)
    is_pos, is_neg = identity_masks(targets, exclude_self=True)
    alpha_p = (1.0 + margin - sim.detach()).clamp(min=0.0)
    alpha_n = (sim.detach() + margin).clamp(min=0.0)
    logit_p = -gamma * alpha_p * (sim - (1.0 - margin))
    logit_n = gamma * alpha_n * (sim - margin)
    return F.softplus(masked_logsumexp(logit_p, is_pos) + masked_logsumexp(logit_n, is_neg)).mean()
