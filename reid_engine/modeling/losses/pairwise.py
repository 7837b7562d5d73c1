"""Shared pieces of the pair-based losses: distances, same-identity masks, masked reductions."""
import torch
from torch.nn import functional as F

__all__ = ["euclidean_dist", "cosine_similarity_matrix", "identity_masks", "masked_logsumexp"]


def euclidean_dist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise euclidean distances between the rows of x (M, D) and y (N, D).

    Returns:
        Tensor: (M, N) distances; squared distances are clamped at 1e-12 before the
        square root so the gradient stays finite for identical rows.
    """
    x = x.float()
    y = y.float()
    squared = (x.pow(2).sum(1, keepdim=True) + y.pow(2).sum(1).unsqueeze(0)
               - 2.0 * x @ y.t())
    return squared.clamp(min=1e-12).sqrt()


def cosine_similarity_matrix(embedding: torch.Tensor) -> torch.Tensor:
    """Cosine similarities between all rows of embedding (N, D); returns (N, N) float32."""
    normed = F.normalize(embedding.float(), dim=1)
    return normed @ normed.t()


def identity_masks(targets: torch.Tensor, exclude_self: bool):
    """Boolean masks of same-identity (positive) and different-identity (negative) pairs.

    Args:
        targets: (N,) identity labels.
        exclude_self: if True, a sample is not its own positive.

    Returns:
        tuple: (is_pos, is_neg), each (N, N) bool.
    """
    same = targets.view(-1, 1) == targets.view(1, -1)
    if exclude_self:
        same = same & ~torch.eye(same.size(0), dtype=torch.bool, device=same.device)
    is_neg = targets.view(-1, 1) != targets.view(1, -1)
    return same, is_neg


def masked_logsumexp(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row-wise logsumexp over the entries where mask is True.

    Rows without any True entry give a very large negative number (not -inf), so sums
    with it and their gradients stay finite.

    Returns:
        Tensor: (N,) values.
    """
    filled = values.masked_fill(~mask, torch.finfo(values.dtype).min / 4)
    return torch.logsumexp(filled, dim=1)
