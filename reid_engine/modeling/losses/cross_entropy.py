"""Cross entropy with (fixed or adaptive) label smoothing."""
import torch
from torch.nn import functional as F

__all__ = ["cross_entropy_loss"]


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor, eps: float,
                       alpha: float = 0.2) -> torch.Tensor:
    """Label-smoothed cross entropy, averaged over the batch.

    The smoothed target puts ``1 - eps`` on the true class and ``eps / (C - 1)`` on each
    other class (the fast-reid convention). With ``eps < 0`` the smoothing is adaptive:
    each sample gets ``eps_i = alpha * p_i``, where ``p_i`` is its (detached) softmax
    probability of the true class, so confident samples are regularised more.

    Args:
        logits: (B, C) class scores.
        targets: (B,) int64 class indices.
        eps: smoothing in [0, 1); negative selects adaptive smoothing.
        alpha: factor of the adaptive smoothing.

    Returns:
        Tensor: scalar loss.
    """
    num_classes = logits.size(1)
    log_probs = F.log_softmax(logits.float(), dim=1)
    true_log_prob = log_probs.gather(1, targets.view(-1, 1)).squeeze(1)
    if eps < 0:
        smoothing = alpha * true_log_prob.detach().exp()
    else:
        smoothing = torch.full_like(true_log_prob, float(eps))
    if num_classes == 1:
        return -true_log_prob.mean()
    # sum_c q_c * log p_c with q = eps/(C-1) off target, 1-eps on target, rewritten so the
    # (B, C) target matrix is never materialised.
    other_log_probs = log_probs.sum(dim=1) - true_log_prob
    per_sample = -(1.0 - smoothing) * true_log_prob - smoothing / (num_classes - 1) * other_log_probs
    return per_sample.mean()
