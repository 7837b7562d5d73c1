"""Non-local (self-attention) block, dot-product form."""
import torch
from torch import nn

from .norm import get_norm

__all__ = ["NonLocal"]

# fast-reid computes its intermediate width as reduc_ratio // reduc_ratio, i.e. 1
# channel; its released checkpoints (g.weight of shape (1, C, 1, 1)) have that width.
# We default to it so those checkpoints load and reproduce their embeddings.
FASTREID_INTER_CHANNELS = 1


class NonLocal(nn.Module):
    """Non-local block: z = x + W(softmax-free attention(theta, phi) @ g).

    The affinity theta(x_i) . phi(x_j) is divided by the number of positions N
    (the 'dot product' variant). Keys: `g`, `theta`, `phi` (1x1 convs C -> I),
    `W.0` (1x1 conv I -> C), `W.1` (norm, initialised to zero so the block starts as
    the identity).

    Args:
        in_channels: C.
        norm: name of the norm in W (see get_norm).
        inter_channels: I; defaults to fast-reid's width of 1 (see module comment).
    """

    def __init__(self, in_channels: int, norm: str = "BN",
                 inter_channels: int = FASTREID_INTER_CHANNELS):
        super().__init__()
        self.inter_channels = inter_channels
        self.g = nn.Conv2d(in_channels, inter_channels, kernel_size=1)
        self.W = nn.Sequential(
            nn.Conv2d(inter_channels, in_channels, kernel_size=1),
            get_norm(norm, in_channels),
        )
        self.theta = nn.Conv2d(in_channels, inter_channels, kernel_size=1)
        self.phi = nn.Conv2d(in_channels, inter_channels, kernel_size=1)
        for name in ("weight", "bias"):
            value = getattr(self.W[1], name, None)
            if value is not None:
                nn.init.zeros_(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x (B, C, H, W) plus the non-local response, same shape."""
        batch, _, height, width = x.shape
        g_x = self.g(x).flatten(2).transpose(1, 2)          # B, N, I
        theta_x = self.theta(x).flatten(2).transpose(1, 2)  # B, N, I
        phi_x = self.phi(x).flatten(2)                      # B, I, N
        affinity = torch.bmm(theta_x, phi_x) / phi_x.shape[-1]
        y = torch.bmm(affinity, g_x).transpose(1, 2)
        y = y.reshape(batch, self.inter_channels, height, width)
        return x + self.W(y)
