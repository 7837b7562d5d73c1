"""ImageNet weights of the ViT backbone: timm's ViT / DeiT files (also the
jx_vit_base_p16_224 file TransReID uses) and the original JAX .npz releases (ViT-B_16.npz,
AugReg), renamed to timm's keys with the position grid resized to the model's token grid.
Importing this module registers the "ViT" weights family.
"""
import logging
import math
from typing import Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from .imagenet_weights import WeightsFamily, load_imagenet_weights, register_weights_family
from .vit_layers import resize_pos_grid

__all__ = ["load_vit_imagenet_weights"]

# The ViT module's logger: the lines keep the source name they have always had.
logger = logging.getLogger("reid_engine.modeling.backbones.vit")


class _PretrainTarget:
    """The token grid of the ViT being loaded (set just before loading, by
    :func:`load_vit_imagenet_weights`), so that the rename step can resize the file's square
    position grid to it."""

    grid: Optional[Tuple[int, int]] = None


_PRETRAIN_TARGET = _PretrainTarget()


# The prefixes under which JAX / big_vision .npz releases keep the parameters (as timm reads them).
_JAX_PREFIXES = ("", "opt/target/", "params/")


def _jax_prefix(state: Mapping[str, Tensor]) -> Optional[str]:
    """The prefix of a JAX ViT .npz state (original ViT / AugReg releases), or None."""
    for prefix in _JAX_PREFIXES:
        if f"{prefix}embedding/kernel" in state and f"{prefix}Transformer/encoderblock_0/LayerNorm_0/scale" in state:
            return prefix
    return None


def _is_timm_vit(state: Mapping[str, Tensor]) -> bool:
    timm = all(k in state for k in ("cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.attn.qkv.weight"))
    return timm or _jax_prefix(state) is not None


def _jax_vit_to_timm(state: Mapping[str, Tensor], prefix: str) -> Dict[str, Tensor]:
    """Rename a JAX ViT (.npz) state to timm's names: kernels are (in, out) and attention
    kernels are split per head, so they are transposed and flattened; q, k, v are fused."""
    def get(name: str) -> Tensor:
        return torch.as_tensor(state[prefix + name])

    out = {
        "patch_embed.proj.weight": get("embedding/kernel").permute(3, 2, 0, 1),  # HWIO -> OIHW
        "patch_embed.proj.bias": get("embedding/bias"),
        "cls_token": get("cls"),
        "pos_embed": get("Transformer/posembed_input/pos_embedding"),
        "norm.weight": get("Transformer/encoder_norm/scale"),
        "norm.bias": get("Transformer/encoder_norm/bias"),
    }
    block = 0
    while f"{prefix}Transformer/encoderblock_{block}/LayerNorm_0/scale" in state:
        src, dst = f"Transformer/encoderblock_{block}/", f"blocks.{block}."
        attn = src + "MultiHeadDotProductAttention_1/"
        for ln, norm in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            out[dst + norm + ".weight"] = get(src + ln + "/scale")
            out[dst + norm + ".bias"] = get(src + ln + "/bias")
        out[dst + "attn.qkv.weight"] = torch.cat(
            [get(attn + part + "/kernel").flatten(1).t() for part in ("query", "key", "value")])
        if prefix + attn + "query/bias" in state:
            out[dst + "attn.qkv.bias"] = torch.cat(
                [get(attn + part + "/bias").flatten() for part in ("query", "key", "value")])
        out[dst + "attn.proj.weight"] = get(attn + "out/kernel").flatten(0, 1).t()
        out[dst + "attn.proj.bias"] = get(attn + "out/bias")
        for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
            out[dst + f"mlp.{fc}.weight"] = get(src + f"MlpBlock_3/{dense}/kernel").t()
            out[dst + f"mlp.{fc}.bias"] = get(src + f"MlpBlock_3/{dense}/bias")
        block += 1
    return {k: v.contiguous() for k, v in out.items()}


def _rename_timm_vit(state: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """Bring a JAX .npz release to timm's names, drop DeiT's distillation token and resize the
    (square) position grid to the model's."""
    prefix = _jax_prefix(state)
    state = _jax_vit_to_timm(state, prefix) if prefix is not None else dict(state)
    pos = state.get("pos_embed")
    extra_tokens = 2 if "dist_token" in state else 1
    if pos is not None and _PRETRAIN_TARGET.grid is not None:
        side = math.isqrt(pos.shape[1] - extra_tokens)
        if side * side == pos.shape[1] - extra_tokens:
            grid_pos = resize_pos_grid(pos[:, extra_tokens:], (side, side), _PRETRAIN_TARGET.grid)
            if (side, side) != tuple(_PRETRAIN_TARGET.grid):
                logger.info("Resized ImageNet position embeddings from %dx%d to %dx%d", side, side,
                            *_PRETRAIN_TARGET.grid)
            state["pos_embed"] = torch.cat([pos[:, :1], grid_pos], dim=1)
    state.pop("dist_token", None)
    return state


register_weights_family(WeightsFamily(
    name="ViT", fingerprint=_is_timm_vit, rename=_rename_timm_vit,
    dropped_prefixes=("head.", "head_dist.", "pre_logits.", "fc_norm."), releases="timm ViT / DeiT .pth, or a JAX ViT .npz"))


def load_vit_imagenet_weights(model: nn.Module, path: str) -> None:
    """Load a timm / JAX ViT ImageNet file into `model` (a VisionTransformer), its position
    embeddings resized to ``model.grid``.

    Args:
        model: the ViT.
        path: the weights file (MODEL.BACKBONE.PRETRAIN_PATH).
    """
    _PRETRAIN_TARGET.grid = model.grid
    try:
        load_imagenet_weights(model, path, "ViT")
    finally:
        _PRETRAIN_TARGET.grid = None
