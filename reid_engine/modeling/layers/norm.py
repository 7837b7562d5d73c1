"""Normalisation layers selected by name (MODEL.BACKBONE.NORM / MODEL.HEADS.NORM)."""
import torch
from torch import nn
from torch.nn import functional as F

from reid_engine.config import ConfigError
from reid_engine.utils.comm import get_world_size
from reid_engine.utils.registry import lookup

__all__ = ["FrozenBatchNorm2d", "GhostBatchNorm", "get_norm", "NORM_NAMES"]

# Groups of GroupNorm, as in fast-reid / detectron2.
_GN_GROUPS = 32


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d whose affine parameters and statistics are fixed buffers.

    The buffers carry BatchNorm2d's names (weight, bias, running_mean, running_var,
    num_batches_tracked), so a checkpoint saved with BN loads into it unchanged and
    the other way round.

    Args:
        num_features: number of channels.
        eps: added to the variance for numerical stability.
    """

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the fixed per-channel affine transform to x (B, C, H, W)."""
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.view(1, -1, 1, 1).to(x.dtype) + shift.view(1, -1, 1, 1).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


class GhostBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d that normalises each of `num_splits` chunks of the batch separately
    in training (ghost batches), and uses the shared running statistics in eval.

    Args:
        num_features: number of channels.
        num_splits: number of ghost batches; the training batch size must divide by it.
    """

    def __init__(self, num_features: int, num_splits: int = 4, **kwargs):
        super().__init__(num_features, **kwargs)
        self.num_splits = num_splits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise x (B, C, H, W); ghost batches in training, running stats in eval."""
        if not self.training or self.num_splits == 1:
            return super().forward(x)
        batch, channels, height, width = x.shape
        if batch % self.num_splits:
            raise ConfigError(
                f"GhostBN: batch size {batch} does not divide into {self.num_splits} ghost "
                f"batches; use a batch size that is a multiple of {self.num_splits}")
        splits = self.num_splits
        # Fold the ghost batches into the channel axis: one batch_norm call, each
        # (split, channel) pair gets its own statistics.
        folded = x.view(batch // splits, splits * channels, height, width)
        running_mean = self.running_mean.repeat(splits)
        running_var = self.running_var.repeat(splits)
        out = F.batch_norm(folded, running_mean, running_var,
                           self.weight.repeat(splits), self.bias.repeat(splits),
                           True, self.momentum if self.momentum is not None else 0.1, self.eps)
        with torch.no_grad():
            self.running_mean.copy_(running_mean.view(splits, channels).mean(0))
            self.running_var.copy_(running_var.view(splits, channels).mean(0))
            self.num_batches_tracked.add_(1)
        return out.view(batch, channels, height, width)


def _batch_norm(channels: int) -> nn.Module:
    return nn.BatchNorm2d(channels)


def _sync_batch_norm(channels: int) -> nn.Module:
    # SyncBatchNorm needs a process group; with one process it is plain BN.
    return nn.SyncBatchNorm(channels) if get_world_size() > 1 else nn.BatchNorm2d(channels)


def _group_norm(channels: int) -> nn.Module:
    if channels % _GN_GROUPS:
        raise ConfigError(f"GN needs channels divisible by {_GN_GROUPS}, got {channels}; "
                          f"use NORM 'BN' for this layer width")
    return nn.GroupNorm(_GN_GROUPS, channels)


_NORM_FACTORIES = {
    "BN": _batch_norm,
    "syncBN": _sync_batch_norm,
    "GN": _group_norm,
    "FrozenBN": FrozenBatchNorm2d,
    "GhostBN": GhostBatchNorm,
}
NORM_NAMES = tuple(_NORM_FACTORIES)


def get_norm(norm: str, channels: int, *, bias_freeze: bool = False,
             key: str = "MODEL.BACKBONE.NORM") -> nn.Module:
    """Build a 2d normalisation layer by name.

    Args:
        norm: one of BN, syncBN (BN when the world size is 1), GN (32 groups),
            FrozenBN, GhostBN (4 ghost batches).
        channels: number of channels.
        bias_freeze: if True the bias (shift) is not trained (requires_grad False).
        key: the config key holding ``norm``, named in the error for an unknown name.

    Returns:
        nn.Module: weight 1, bias 0 at construction.
    """
    layer = lookup(_NORM_FACTORIES, norm, key)(channels)
    bias = getattr(layer, "bias", None)
    if bias_freeze and isinstance(bias, nn.Parameter):
        bias.requires_grad_(False)
    return layer
