"""Squeeze-and-excitation channel attention."""
import torch
from torch import nn

__all__ = ["SELayer"]


class SELayer(nn.Module):
    """Squeeze-and-excitation: rescale channels by a gate computed from their means.

    Keys: `fc.0.weight` (C/r, C), `fc.2.weight` (C, C/r); no biases (fast-reid layout).

    Args:
        channels: number of channels.
        reduction: bottleneck ratio r of the gating MLP.
    """

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        hidden = max(channels // reduction, 1)
        self.fc = nn.Sequential(
            nn.Linear(channels, hidden, bias=False),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, channels, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x (B, C, H, W) multiplied by its per-channel gate in (0, 1)."""
        gate = self.fc(x.mean(dim=(2, 3)))
        return x * gate[:, :, None, None]
