"""Pooling layers that turn a feature map (B, C, H, W) into (B, D, 1, 1).

Selected by MODEL.HEADS.POOL_LAYER through POOLING_REGISTRY; each is built with no
arguments (build contract: utils.registry).
"""
import torch
from torch import nn
from torch.nn import functional as F

from reid_engine.utils.registry import Registry

__all__ = [
    "POOLING_REGISTRY", "Identity", "Flatten", "GlobalAvgPool", "GlobalMaxPool",
    "GeneralizedMeanPooling", "GeneralizedMeanPoolingP", "AdaptiveAvgMaxPool",
    "ClipGlobalAvgPool", "build_pooling",
]

POOLING_REGISTRY = Registry("POOLING", key="MODEL.HEADS.POOL_LAYER")
POOLING_REGISTRY.__doc__ = "Pooling layers by MODEL.HEADS.POOL_LAYER name; built with no arguments."


@POOLING_REGISTRY.register()
class Identity(nn.Module):
    """Return the input unchanged (for backbones that already output (B, C, 1, 1))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x."""
        return x


@POOLING_REGISTRY.register()
class Flatten(nn.Module):
    """Flatten the whole map into the channel axis: (B, C*H*W, 1, 1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x reshaped to (B, C*H*W, 1, 1)."""
        return x.reshape(x.shape[0], -1, 1, 1)


@POOLING_REGISTRY.register()
class GlobalAvgPool(nn.Module):
    """Mean over all spatial positions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the spatial mean, (B, C, 1, 1)."""
        return F.adaptive_avg_pool2d(x, 1)


@POOLING_REGISTRY.register()
class GlobalMaxPool(nn.Module):
    """Max over all spatial positions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the spatial max, (B, C, 1, 1)."""
        return F.adaptive_max_pool2d(x, 1)


def _generalized_mean(x: torch.Tensor, p: torch.Tensor, eps: float) -> torch.Tensor:
    # (mean(clamp(x)^p))^(1/p); clamping keeps the fractional powers real.
    return F.adaptive_avg_pool2d(x.clamp(min=eps).pow(p), 1).pow(1.0 / p)


@POOLING_REGISTRY.register()
class GeneralizedMeanPooling(nn.Module):
    """Generalised-mean (GeM) pooling with a fixed exponent.

    Args:
        norm: the exponent p (3 by default; 1 = average, large = max).
        eps: lower clamp of the inputs.
    """

    def __init__(self, norm: float = 3.0, eps: float = 1e-6):
        super().__init__()
        if norm <= 0:
            raise ValueError(f"GeM exponent must be > 0, got {norm}")
        self.p = float(norm)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return (mean over positions of max(x, eps)^p)^(1/p), (B, C, 1, 1)."""
        return _generalized_mean(x, self.p, self.eps)

    def extra_repr(self) -> str:
        return f"p={self.p}, eps={self.eps}"


@POOLING_REGISTRY.register()
class GeneralizedMeanPoolingP(nn.Module):
    """GeM pooling whose exponent is a trained parameter `p` of shape (1,).

    Args:
        norm: initial exponent.
        eps: lower clamp of the inputs.
    """

    def __init__(self, norm: float = 3.0, eps: float = 1e-6):
        super().__init__()
        self.p = nn.Parameter(torch.full((1,), float(norm)))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return GeM pooling of x with the learned exponent, (B, C, 1, 1)."""
        return _generalized_mean(x, self.p, self.eps)


@POOLING_REGISTRY.register()
class AdaptiveAvgMaxPool(nn.Module):
    """Sum of global average and global max pooling (keeps the channel count)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return mean + max over positions, (B, C, 1, 1)."""
        return F.adaptive_avg_pool2d(x, 1) + F.adaptive_max_pool2d(x, 1)


@POOLING_REGISTRY.register()
class ClipGlobalAvgPool(nn.Module):
    """Global average pooling clipped to [0, 1]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return clamp(mean over positions, 0, 1), (B, C, 1, 1)."""
        return F.adaptive_avg_pool2d(x, 1).clamp(0.0, 1.0)


def build_pooling(name: str) -> nn.Module:
    """Build the pooling layer registered under `name`.

    Args:
        name: a MODEL.HEADS.POOL_LAYER value.

    Returns:
        nn.Module mapping (B, C, H, W) to (B, D, 1, 1) (Identity returns its input).
    """
    return POOLING_REGISTRY.build(name)
