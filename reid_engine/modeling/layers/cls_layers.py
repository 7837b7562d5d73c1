"""Classifier layers: turn class logits into the (margin-adjusted, scaled) logits that
the classification loss sees.

The class-centre matrix itself is the head's parameter `heads.weight` (fast-reid's
layout). The head feeds plain logits (feature @ weight.T) to `Linear`, and cosine
logits (normalised feature @ normalised weight.T) to the margin layers. Selected by
MODEL.HEADS.CLS_LAYER through CLS_LAYER_REGISTRY; built as cls(num_classes, scale,
margin) (build contract: utils.registry). A target of -1 marks a sample whose class is not among these centres; it
gets no positive margin.
"""
import torch
from torch import nn

from reid_engine.utils.registry import Registry

__all__ = ["CLS_LAYER_REGISTRY", "Linear", "CosSoftmax", "ArcSoftmax", "CircleSoftmax",
           "build_cls_layer"]

CLS_LAYER_REGISTRY = Registry("CLS_LAYER", key="MODEL.HEADS.CLS_LAYER")
CLS_LAYER_REGISTRY.__doc__ = (
    "Classifier layers by MODEL.HEADS.CLS_LAYER name; built as cls(num_classes, scale, margin).")


def _target_mask(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Return a bool (B, num_classes) mask of each sample's target class (none for -1)."""
    classes = torch.arange(logits.shape[1], device=logits.device)
    return (targets[:, None] == classes[None, :]) & (targets[:, None] >= 0)


@CLS_LAYER_REGISTRY.register()
class Linear(nn.Module):
    """Plain softmax classifier: logits times SCALE.

    Args:
        num_classes: number of classes.
        scale: multiplier s of the logits.
        margin: unused by this layer (kept for a common signature).
    """

    #: whether the head should feed cosine logits (normalised feature and weight).
    uses_cosine = False

    def __init__(self, num_classes: int, scale: float = 1.0, margin: float = 0.0):
        super().__init__()
        self.num_classes = num_classes
        self.s = float(scale)
        self.m = float(margin)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Return s * logits.

        Args:
            logits: (B, num_classes).
            targets: (B,) int64 class ids (-1 = none).
        """
        return logits * self.s

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, scale={self.s}, margin={self.m}"


@CLS_LAYER_REGISTRY.register()
class CosSoftmax(Linear):
    """CosFace / large-margin cosine: s * (cos - m) for the target class, s * cos else."""

    uses_cosine = True

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Return margin-adjusted scaled logits from cosine logits (B, num_classes)."""
        mask = _target_mask(logits, targets)
        return (logits - self.m * mask.to(logits.dtype)) * self.s


@CLS_LAYER_REGISTRY.register()
class ArcSoftmax(Linear):
    """ArcFace / additive angular margin: s * cos(theta + m) for the target class."""

    uses_cosine = True

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Return s * cos(acos(logits) + m * onehot(target)) from cosine logits."""
        mask = _target_mask(logits, targets)
        # acos has an infinite slope at +-1; stay just inside.
        eps = 1e-7 if logits.dtype == torch.float64 else 1e-6
        theta = torch.acos(logits.clamp(-1.0 + eps, 1.0 - eps))
        adjusted = torch.where(mask, torch.cos(theta + self.m), logits)
        return adjusted * self.s


@CLS_LAYER_REGISTRY.register()
class CircleSoftmax(Linear):
    """Circle loss classifier (Sun et al. 2020) with self-paced weights.

    Target class: s * alpha_p * (cos - (1 - m)), alpha_p = max(1 + m - cos, 0);
    other classes: s * alpha_n * (cos - m), alpha_n = max(cos + m, 0); the weights
    alpha are not differentiated through.
    """

    uses_cosine = True

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Return circle-adjusted scaled logits from cosine logits (B, num_classes)."""
        mask = _target_mask(logits, targets)
        detached = logits.detach()
        alpha_p = (1.0 + self.m - detached).clamp(min=0.0)
        alpha_n = (detached + self.m).clamp(min=0.0)
        positive = alpha_p * (logits - (1.0 - self.m))
        negative = alpha_n * (logits - self.m)
        return torch.where(mask, positive, negative) * self.s


def build_cls_layer(name: str, num_classes: int, scale: float, margin: float) -> nn.Module:
    """Build the classifier layer registered under `name`.

    Args:
        name: a MODEL.HEADS.CLS_LAYER value.
        num_classes, scale, margin: passed to the layer.

    Returns:
        nn.Module with forward(logits, targets) -> adjusted logits and an attribute
        `uses_cosine`.
    """
    return CLS_LAYER_REGISTRY.build(name, num_classes, scale, margin)
