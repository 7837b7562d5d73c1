"""Focal loss (Lin et al., "Focal Loss for Dense Object Detection") over softmax outputs."""
import torch
from torch.nn import functional as F

__all__ = ["focal_loss"]

_REDUCTIONS = ("mean", "sum", "none")


def focal_loss(logits: torch.Tensor, targets: torch.Tensor, alpha: float, gamma: float,
               reduction: str = "mean") -> torch.Tensor:
    """Multi-class focal loss: ``-alpha * (1 - p_t) ** gamma * log(p_t)`` per sample.

    Args:
        logits: (B, C) class scores.
        targets: (B,) int64 class indices.
        alpha: weight of every sample's term.
        gamma: focusing exponent (0 gives alpha times cross entropy).
        reduction: "mean", "sum" or "none".

    Returns:
        Tensor: scalar (mean / sum) or (B,) per-sample losses.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"focal_loss: unknown reduction {reduction!r}; use one of {_REDUCTIONS}")
    log_p_t = F.log_softmax(logits.float(), dim=1).gather(1, targets.view(-1, 1)).squeeze(1)
    p_t = log_p_t.exp()
    # clamp: 1 - p_t can round to a tiny negative number, and a fractional power of it is NaN
    per_sample = -alpha * (1.0 - p_t).clamp(min=0.0).pow(gamma) * log_p_t
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "sum":
        return per_sample.sum()
    return per_sample
