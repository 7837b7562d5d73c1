"""Temporal pooling: one feature map per tracklet from the maps of its T frames."""
import torch
from torch import nn

from reid_engine.utils.registry import check_choice

__all__ = ["TEMPORAL_POOLS", "TemporalPool"]

#: accepted MODEL.HEADS.TEMPORAL_POOL values
TEMPORAL_POOLS = ("avg", "max", "attention")


class TemporalPool(nn.Module):
    """Pool (B, T, C, h, w) frame maps over T into (B, C, h, w).

    ``avg`` and ``max`` are the element-wise mean / maximum over the frames (torchreid pools
    its test features the same two ways). ``attention`` weights the frames by a softmax over
    T of a learned score of each frame's spatially averaged feature (temporal attention of
    Gao & Nevatia, 2018); its only parameters are that scoring layer (``attention``).

    Args:
        mode: "avg", "max" or "attention".
        channels: C (needed by "attention").
    """

    def __init__(self, mode: str = "avg", channels: int = 0):
        super().__init__()
        check_choice(mode, TEMPORAL_POOLS, "MODEL.HEADS.TEMPORAL_POOL")
        self.mode = mode
        self.attention = nn.Linear(channels, 1) if mode == "attention" else None

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        """Args: maps (B, T, C, h, w). Returns: (B, C, h, w)."""
        if self.mode == "avg":
            return maps.mean(dim=1)
        if self.mode == "max":
            return maps.amax(dim=1)
        scores = self.attention(maps.mean(dim=(3, 4)))  # (B, T, 1)
        weights = torch.softmax(scores, dim=1)[..., None, None]
        return (maps * weights).sum(dim=1)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"
