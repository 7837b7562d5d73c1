"""The pieces of a Vision Transformer in timm's key names (fast-reid's ViT): the size
:class:`ViTSpec`, the overlapping patch embedding, attention, MLP, pre-norm block with
stochastic depth, and the token-grid arithmetic (grid size, position-embedding resize).
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["PATCH_SIZE", "ViTSpec", "patch_grid", "resize_pos_grid", "DropPath", "Attention", "Mlp", "Block",
           "PatchEmbed", "LN_EPS"]

PATCH_SIZE = 16
# LayerNorm epsilon of fast-reid's (and timm's original) ViT.
LN_EPS = 1e-6


@dataclass(frozen=True)
class ViTSpec:
    """Width and depth of a ViT size.

    Attributes:
        dim: token width (the output channels).
        depth: number of transformer blocks.
        heads: attention heads per block.
        mlp_ratio: hidden width of the MLP / dim.
        qkv_bias: whether the query/key/value projection has a bias.
        qk_scale: attention logit scale; None = head_dim ** -0.5.
    """

    dim: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    qk_scale: Optional[float] = None


def patch_grid(size: Sequence[int], stride: Sequence[int], patch: int = PATCH_SIZE) -> Tuple[int, int]:
    """Token grid (rows, cols) of a 16x16 patch embedding with the given stride (fast-reid's
    formula: (H - 16) // stride_h + 1, likewise for W).

    Args:
        size: image (H, W).
        stride: patch stride (sh, sw); 16 = non-overlapping patches.
        patch: patch size.
    """
    return (size[0] - patch) // stride[0] + 1, (size[1] - patch) // stride[1] + 1


def resize_pos_grid(grid_pos: Tensor, old_grid: Tuple[int, int], new_grid: Tuple[int, int]) -> Tensor:
    """Bilinearly resize a grid of position embeddings (1, h*w, C) -> (1, h'*w', C)."""
    if tuple(old_grid) == tuple(new_grid):
        return grid_pos
    dim = grid_pos.shape[-1]
    grid = grid_pos.reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)
    # float32 interpolation: bf16 / fp16 weights would lose the small position differences
    grid = F.interpolate(grid.float(), size=tuple(new_grid), mode="bilinear", align_corners=False)
    return grid.to(grid_pos.dtype).permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim)


class DropPath(nn.Module):
    """Stochastic depth: in training, zero a residual branch per sample with probability
    `prob` and scale the kept ones by 1 / (1 - prob).

    The rate is a (non-persistent) buffer rather than a Python number, and `active` says
    whether the model uses stochastic depth at all: blocks whose rates differ (they grow
    with depth) then run the same code, so compiling blocks (MODEL.COMPILE_SCOPE blocks)
    traces one graph for all of them instead of one per rate. A rate of 0 in an active
    model multiplies by an all-ones mask, which leaves the values exact.
    """

    def __init__(self, prob: float = 0.0, active: Optional[bool] = None):
        super().__init__()
        self.prob = float(prob)
        self.active = bool(prob > 0.0) if active is None else bool(active)
        self.register_buffer("rate", torch.tensor(self.prob), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or not self.active:
            return x
        keep = 1.0 - self.rate
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep.to(x.dtype))
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"prob={self.prob}"


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection (keys `qkv`, `proj`)."""

    def __init__(self, dim: int, heads: int, qkv_bias: bool, qk_scale: Optional[float],
                 attn_drop: float, proj_drop: float):
        super().__init__()
        self.heads = heads
        self.scale = qk_scale if qk_scale is not None else (dim // heads) ** -0.5
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        # SDPA keeps the softmax in float32 under bf16 / fp16 autocast (and uses fused kernels)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], scale=self.scale,
                                             dropout_p=self.attn_drop if self.training else 0.0)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, tokens, dim)))


class Mlp(nn.Module):
    """fc1 -> GELU -> dropout -> fc2 -> dropout."""

    def __init__(self, dim: int, hidden: int, drop: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)), with
    stochastic depth on both branches."""

    def __init__(self, spec: ViTSpec, drop: float, attn_drop: float, drop_path: float,
                 stochastic_depth: Optional[bool] = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(spec.dim, eps=LN_EPS)
        self.attn = Attention(spec.dim, spec.heads, spec.qkv_bias, spec.qk_scale, attn_drop, drop)
        self.drop_path = DropPath(drop_path, active=stochastic_depth)
        self.norm2 = nn.LayerNorm(spec.dim, eps=LN_EPS)
        self.mlp = Mlp(spec.dim, int(spec.dim * spec.mlp_ratio), drop)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """16x16 patches at a stride (overlapping below 16) projected to tokens (key `proj`)."""

    def __init__(self, dim: int, stride: Tuple[int, int], in_chans: int = 3):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=PATCH_SIZE, stride=stride)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)
