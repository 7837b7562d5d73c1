"""Instance-batch normalisation (IBN-a) layer."""
import torch
from torch import nn

from .norm import get_norm

__all__ = ["IBN"]


class IBN(nn.Module):
    """Normalise the first half of the channels with InstanceNorm (affine) and the rest
    with a batch-style norm, as in IBN-Net's IBN-a block.

    Sub-modules are named `IN` and `BN` so state-dict keys read `bn1.IN.*`, `bn1.BN.*`.

    Args:
        planes: total channels.
        norm: name of the norm for the second half (see get_norm).
    """

    def __init__(self, planes: int, norm: str = "BN"):
        super().__init__()
        self.half = planes // 2
        self.IN = nn.InstanceNorm2d(self.half, affine=True)
        self.BN = get_norm(norm, planes - self.half)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the channel-wise concatenation of IN(first half) and BN(second half)."""
        first, second = torch.split(x, [self.half, x.shape[1] - self.half], dim=1)
        return torch.cat((self.IN(first.contiguous()), self.BN(second.contiguous())), dim=1)
