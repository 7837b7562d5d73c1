"""Triplet loss with hard or softmax-weighted example mining (Hermans et al., 2017)."""
import torch
from torch.nn import functional as F

from .distributed import gather_with_local_grad
from .pairwise import euclidean_dist, identity_masks

__all__ = ["triplet_loss", "hard_example_mining", "weighted_example_mining"]


def hard_example_mining(dist_mat: torch.Tensor, is_pos: torch.Tensor, is_neg: torch.Tensor):
    """For each anchor, the distance to its farthest positive and to its nearest negative.

    Args:
        dist_mat: (N, N) distances.
        is_pos / is_neg: (N, N) bool masks of same / different identity pairs.

    Returns:
        tuple: (dist_ap, dist_an), each (N,). Anchors without negatives get +inf in
        dist_an (callers drop them).
    """
    dist_ap = dist_mat.masked_fill(~is_pos, float("-inf")).amax(dim=1)
    dist_an = dist_mat.masked_fill(~is_neg, float("inf")).amin(dim=1)
    return dist_ap, dist_an


def _masked_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # A finite fill keeps rows with no True entry free of NaN (they become all zeros).
    filled = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    return F.softmax(filled, dim=1) * mask


def weighted_example_mining(dist_mat: torch.Tensor, is_pos: torch.Tensor, is_neg: torch.Tensor):
    """Softmax-weighted positive and negative distances per anchor.

    Positives are weighted by ``softmax(d)`` over the anchor's positives (far ones count
    more), negatives by ``softmax(-d)`` over its negatives (near ones count more).

    Args:
        dist_mat: (N, N) distances.
        is_pos / is_neg: (N, N) bool masks of same / different identity pairs.

    Returns:
        tuple: (dist_ap, dist_an), each (N,).
    """
    weights_ap = _masked_softmax(dist_mat, is_pos)
    weights_an = _masked_softmax(-dist_mat, is_neg)
    return (dist_mat * weights_ap).sum(dim=1), (dist_mat * weights_an).sum(dim=1)


def triplet_loss(embedding: torch.Tensor, targets: torch.Tensor, margin: float,
                 norm_feat: bool, hard_mining: bool) -> torch.Tensor:
    """Batch triplet loss on euclidean distances.

    Per anchor ``relu(d_ap - d_an + margin)``, or the soft margin ``softplus(d_ap - d_an)``
    when ``margin == 0``; averaged over the anchors that have at least one negative
    (a batch with none gives 0, still attached to the graph). In a distributed run the
    features and labels of all workers are compared; gradients reach the local part.

    Args:
        embedding: (B, D) features.
        targets: (B,) identity labels.
        margin: >= 0; 0 selects the soft margin.
        norm_feat: L2-normalise the features first.
        hard_mining: hardest positive / negative per anchor; otherwise softmax-weighted.

    Returns:
        Tensor: scalar loss.
    """
    if norm_feat:
        embedding = F.normalize(embedding.float(), dim=1)
    embedding = gather_with_local_grad(embedding)
    targets = gather_with_local_grad(targets)

    dist_mat = euclidean_dist(embedding, embedding)
    is_pos, is_neg = identity_masks(targets, exclude_self=False)
    mining = hard_example_mining if hard_mining else weighted_example_mining
    dist_ap, dist_an = mining(dist_mat, is_pos, is_neg)

    gap = dist_ap - dist_an
    per_anchor = F.relu(gap + margin) if margin > 0 else F.softplus(gap)
    # A weighted mean instead of boolean indexing: no host sync on the GPU.
    valid = is_neg.any(dim=1).to(per_anchor.dtype)
    return (per_anchor * valid).sum() / valid.sum().clamp(min=1.0)
