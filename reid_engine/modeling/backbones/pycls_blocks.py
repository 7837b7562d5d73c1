"""Pieces shared by the pycls design-space backbones (RegNet, EfficientNet).

Module names follow pycls (the same as fast-reid's copies): a stem `stem.conv / stem.bn`,
stages `s1..sN` of blocks `b1..bM`, convolutions with their norm beside them under
`<name>` / `<name>_bn`, and squeeze-excitation `se.f_ex.0 / se.f_ex.2` (1x1 convolutions
with biases). Also pycls's weight init; `rename_keys`, which maps both families' ImageNet
weight layouts, is re-exported from `imagenet_weights`.
"""
import math
from collections import OrderedDict
from typing import Iterable, Tuple

import torch
from torch import nn

from ..layers import get_norm
from .imagenet_weights import rename_keys

__all__ = ["SqueezeExcitation", "Stem", "conv_norm", "stage", "init_pycls_weights", "rename_keys"]


def conv_norm(in_channels: int, out_channels: int, kernel_size: int, norm: str, *,
              stride: int = 1, groups: int = 1) -> Tuple[nn.Conv2d, nn.Module]:
    """A bias-free convolution with "same" padding (odd kernels) and the norm that follows it.

    Args:
        in_channels, out_channels: channels.
        kernel_size: odd kernel size.
        norm: norm name (see get_norm).
        stride: stride of the convolution.
        groups: convolution groups.

    Returns:
        (conv, norm layer): the caller stores them as `<name>` and `<name>_bn` (pycls's names).
    """
    conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                     padding=(kernel_size - 1) // 2, groups=groups, bias=False)
    return conv, get_norm(norm, out_channels)


class SqueezeExcitation(nn.Module):
    """pycls's squeeze-excitation: x * sigmoid(conv(act(conv(mean(x))))).

    Keys: `f_ex.0.weight` (squeezed, C, 1, 1), `f_ex.0.bias`, `f_ex.2.weight` (C, squeezed,
    1, 1), `f_ex.2.bias`.

    Args:
        channels: channels of x.
        squeezed: width of the gating bottleneck.
        activation: the bottleneck's activation module (ReLU in RegNet, SiLU in EfficientNet).
    """

    def __init__(self, channels: int, squeezed: int, activation: nn.Module):
        super().__init__()
        self.f_ex = nn.Sequential(
            nn.Conv2d(channels, squeezed, 1, bias=True),
            activation,
            nn.Conv2d(squeezed, channels, 1, bias=True),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x (B, C, H, W) scaled by its per-channel gate in (0, 1)."""
        return x * self.f_ex(x.mean(dim=(2, 3), keepdim=True))


class Stem(nn.Module):
    """pycls's ImageNet stem: 3x3 stride-2 convolution, norm, activation.

    Args:
        out_channels: stem width.
        norm: norm name (see get_norm).
        activation: the activation module (ReLU in RegNet, SiLU in EfficientNet).
    """

    def __init__(self, out_channels: int, norm: str, activation: nn.Module):
        super().__init__()
        self.conv, self.bn = conv_norm(3, out_channels, 3, norm, stride=2)
        self.act = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images (B, 3, H, W) to (B, out_channels, ceil(H/2), ceil(W/2))."""
        return self.act(self.bn(self.conv(x)))


def stage(blocks: Iterable[nn.Module]) -> nn.Sequential:
    """A stage of blocks named b1, b2, ... (pycls's keys `s<i>.b<j>.*`)."""
    return nn.Sequential(OrderedDict((f"b{index}", block) for index, block in enumerate(blocks, start=1)))


def init_pycls_weights(model: nn.Module) -> None:
    """pycls's init: conv weights normal with std sqrt(2 / (k * k * out_channels)) (conv
    biases keep PyTorch's default), norm weight 1 / bias 0, linear normal(0, 0.01) / 0."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
            nn.init.normal_(module.weight, mean=0.0, std=math.sqrt(2.0 / fan_out))
        elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)) and module.weight is not None:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.01)
            nn.init.zeros_(module.bias)
