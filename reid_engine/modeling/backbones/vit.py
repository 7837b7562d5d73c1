"""Vision Transformer backbone (ViT, with TransReID's overlapping patches and side information
embedding), in the key layout of fast-reid's ``build_vit_backbone`` (timm's names).

The backbone returns the final-normed class token as a (B, C, 1, 1) map, so the head runs
with POOL_LAYER Identity. Its layers are in :mod:`.vit_layers` and its ImageNet weights in
:mod:`.vit_weights`; the names tests and users import from here are re-exported.
"""
import copy
import math
from typing import Dict, Optional, Sequence, Set, Tuple

import torch
from torch import Tensor, nn

from reid_engine.config import ConfigError

from ...utils.registry import lookup
from .build import BACKBONE_REGISTRY, check_backbone_options
from .vit_layers import LN_EPS, PATCH_SIZE, Block, PatchEmbed, ViTSpec, patch_grid, resize_pos_grid
from .vit_weights import load_vit_imagenet_weights

__all__ = ["VIT_DEPTHS", "LastBlockCopy", "ViTSpec", "VisionTransformer", "build_vit_backbone", "patch_grid",
           "resize_pos_grid"]


#: DEPTH -> size. "small" is fast-reid's (timm's first ViT-S: 768 wide, 8 blocks, 3x MLP, no
#: qkv bias and a 768 ** -0.5 logit scale), not the 384-wide DeiT-S; "large" is ViT-L/16.
VIT_DEPTHS: Dict[str, ViTSpec] = {
    "small": ViTSpec(dim=768, depth=8, heads=8, mlp_ratio=3.0, qkv_bias=False, qk_scale=768 ** -0.5),
    "base": ViTSpec(dim=768, depth=12, heads=12),
    "large": ViTSpec(dim=1024, depth=24, heads=16),
}


def _class_token_map(tokens: Tensor) -> Tensor:
    """The class token of (B, 1 + n, C) tokens as a (B, C, 1, 1) map (the head's input)."""
    return tokens[:, 0].reshape(tokens.shape[0], -1, 1, 1)


def _norm_and_bias_names(model: nn.Module) -> Set[str]:
    """Names of the LayerNorm parameters and biases of `model` (trained without weight decay)."""
    names = set()
    for name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            if isinstance(module, nn.LayerNorm) or param_name == "bias":
                names.add(f"{name}.{param_name}" if name else param_name)
    return names


class VisionTransformer(nn.Module):
    """ViT over a token grid fixed by the training size; other input sizes interpolate the
    position embeddings bilinearly at run time.

    Args:
        spec: the size (:data:`VIT_DEPTHS` or a custom :class:`ViTSpec`).
        img_size: the training image (H, W); it fixes the number of positions.
        stride: patch stride (sh, sw).
        drop: dropout after positions, in attention output and MLP (DROP_RATIO).
        attn_drop: dropout on attention weights (ATT_DROP_RATE).
        drop_path: stochastic depth rate of the last block, linear from 0 (DROP_PATH_RATIO).
        num_cameras: > 1 adds the side information embedding `sie_embed` (cameras x 1 x dim).
        sie_coe: weight of the camera embedding (SIE_COE).
    """

    #: the meta architecture passes the batch's camera ids (``camids=``) to forward
    takes_camids = True

    def __init__(self, spec: ViTSpec, img_size: Sequence[int] = (256, 128), stride: Sequence[int] = (16, 16),
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0, num_cameras: int = 0,
                 sie_coe: float = 0.0):
        super().__init__()
        self.stride = (int(stride[0]), int(stride[1]))
        self.grid = patch_grid(img_size, self.stride)
        self.out_channels = spec.dim
        self.sie_coe = float(sie_coe)
        self.patch_embed = PatchEmbed(spec.dim, self.stride)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.grid[0] * self.grid[1], spec.dim))
        self.sie_embed = nn.Parameter(torch.zeros(num_cameras, 1, spec.dim)) if num_cameras > 1 else None
        self.pos_drop = nn.Dropout(drop)
        rates = torch.linspace(0, drop_path, spec.depth).tolist()  # stochastic depth grows with depth
        # every block's DropPath is active when any is (the first one's rate is 0): one code path
        self.blocks = nn.ModuleList(Block(spec, drop, attn_drop, rate, stochastic_depth=drop_path > 0) for rate in rates)
        self.norm = nn.LayerNorm(spec.dim, eps=LN_EPS)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """timm's init: truncated normal (std 0.02) tokens, positions and linear weights, zero
        biases, unit LayerNorms; the patch conv N(0, 2 / (k*k*out)) as fast-reid."""
        for tensor in (self.cls_token, self.pos_embed, self.sie_embed):
            if tensor is not None:
                nn.init.trunc_normal_(tensor, std=0.02, a=-2.0, b=2.0)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02, a=-2.0, b=2.0)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        conv = self.patch_embed.proj
        nn.init.normal_(conv.weight, std=math.sqrt(2.0 / (PATCH_SIZE * PATCH_SIZE * conv.out_channels)))

    def no_weight_decay(self) -> Set[str]:
        """Names of the parameters trained without weight decay (read by the solver):
        tokens, positions, the camera embedding, every LayerNorm and every bias."""
        names = {"cls_token", "pos_embed"} | ({"sie_embed"} if self.sie_embed is not None else set())
        return names | _norm_and_bias_names(self)

    def layer_ids(self) -> Tuple[Dict[str, int], int]:
        """Layer index of every parameter for layer-wise LR decay (read by the solver):
        0 for the embeddings, i + 1 for block i, depth + 1 for the final norm.

        Returns:
            (name -> layer id, number of layers = depth + 2).
        """
        depth = len(self.blocks)
        ids = {}
        for name, _ in self.named_parameters():
            if name.startswith("blocks."):
                ids[name] = int(name.split(".")[1]) + 1
            elif name.startswith("norm."):
                ids[name] = depth + 1
            else:
                ids[name] = 0
        return ids, depth + 2

    def positions(self, grid: Tuple[int, int]) -> Tensor:
        """Position embeddings (1, 1 + h*w, C) for a token grid, resized from the stored one."""
        if tuple(grid) == self.grid:
            return self.pos_embed
        cls_pos, grid_pos = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        return torch.cat([cls_pos, resize_pos_grid(grid_pos, self.grid, grid)], dim=1)

    def forward(self, x: Tensor, camids: Optional[Tensor] = None) -> Tensor:
        """Images (B, 3, H, W) [and camera ids (B,)] -> class token (B, C, 1, 1)."""
        return _class_token_map(self.norm(self.forward_tokens(x, camids)))

    def forward_tokens(self, x: Tensor, camids: Optional[Tensor] = None, skip_last: int = 0) -> Tensor:
        """Images (B, 3, H, W) [and camera ids (B,)] -> tokens (B, 1 + h*w, C), class token
        first, after all blocks but the last `skip_last` and before the final norm."""
        grid = patch_grid(x.shape[-2:], self.stride)
        tokens = self.patch_embed(x)
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)
        tokens = tokens + self.positions(grid)
        if self.sie_embed is not None:
            if camids is None:
                raise ValueError("this ViT has a camera embedding (SIE); pass camids (B,) with the images, "
                                 "e.g. a batch dict with 'camids'")
            tokens = tokens + self.sie_coe * self.sie_embed[camids.to(x.device).long()]
        tokens = self.pos_drop(tokens)
        for block in self.blocks[:len(self.blocks) - skip_last]:
            tokens = block(tokens)
        return tokens

    def last_block_feature(self, tokens: Tensor) -> Tensor:
        """Tokens from ``forward_tokens(..., skip_last=1)`` -> the class token (B, C, 1, 1) after
        the last block and the final norm (what ``forward`` returns)."""
        return _class_token_map(self.norm(self.blocks[-1](tokens)))


class LastBlockCopy(nn.Module):
    """A copy of a ViT's last block and final norm (TransReID's local branch of the jigsaw
    patch module). It declares the ViT's solver recipe for its parameters: no weight decay on
    norms and biases; for layer-wise LR decay the block is layer `depth`, the norm `depth + 1`.

    Args:
        vit: the VisionTransformer to copy from (its current weights).
    """

    def __init__(self, vit: VisionTransformer):
        super().__init__()
        self.block = copy.deepcopy(vit.blocks[-1])
        self.norm = copy.deepcopy(vit.norm)
        self.depth = len(vit.blocks)

    def forward(self, tokens: Tensor) -> Tensor:
        """Tokens (B, 1 + n, C) -> the normed class token (B, C, 1, 1)."""
        return _class_token_map(self.norm(self.block(tokens)))

    def no_weight_decay(self) -> Set[str]:
        """Its LayerNorm parameters and biases (read by the solver)."""
        return _norm_and_bias_names(self)

    def layer_ids(self) -> Tuple[Dict[str, int], int]:
        """(name -> layer id as in the ViT, number of layers = depth + 2)."""
        return ({name: self.depth + 1 if name.startswith("norm.") else self.depth
                 for name, _ in self.named_parameters()}, self.depth + 2)


def _check_config(cfg) -> ViTSpec:
    """Validate the ViT keys without building; returns the size."""
    opts = cfg.MODEL.BACKBONE
    spec = lookup(VIT_DEPTHS, opts.DEPTH, "MODEL.BACKBONE.DEPTH")
    check_backbone_options(cfg, supported=())
    stride = tuple(opts.STRIDE_SIZE)
    if len(stride) != 2 or not all(isinstance(s, int) and 1 <= s <= PATCH_SIZE for s in stride):
        raise ConfigError(f"MODEL.BACKBONE.STRIDE_SIZE must be two ints in 1..{PATCH_SIZE} (16 = non-overlapping "
                          f"patches, 12 = TransReID's overlap), got {opts.STRIDE_SIZE}")
    size = tuple(cfg.INPUT.SIZE_TRAIN)
    if min(size) < PATCH_SIZE:
        raise ConfigError(f"INPUT.SIZE_TRAIN {list(size)} is smaller than the {PATCH_SIZE}-pixel ViT patch; "
                          f"use at least {PATCH_SIZE}x{PATCH_SIZE} (e.g. 256x128)")
    for key in ("DROP_RATIO", "ATT_DROP_RATE", "DROP_PATH_RATIO"):
        if not 0.0 <= getattr(opts, key) < 1.0:
            raise ConfigError(f"MODEL.BACKBONE.{key} must be in [0, 1), got {getattr(opts, key)}")
    if opts.SIE_COE < 0:
        raise ConfigError(f"MODEL.BACKBONE.SIE_COE must be >= 0 (0 = no camera embedding), got {opts.SIE_COE}")
    if opts.SIE_COE > 0 and opts.NUM_CAMERAS < -1:
        raise ConfigError(f"MODEL.BACKBONE.NUM_CAMERAS must be -1 (from the training set), 0 (no camera "
                          f"embedding) or the camera count, got {opts.NUM_CAMERAS}")
    return spec


@BACKBONE_REGISTRY.register()
def build_vit_backbone(cfg) -> VisionTransformer:
    """Build the ViT of MODEL.BACKBONE.DEPTH ("small", "base", "large") for INPUT.SIZE_TRAIN.

    Reads STRIDE_SIZE, DROP_RATIO, ATT_DROP_RATE, DROP_PATH_RATIO, SIE_COE, NUM_CAMERAS
    (SIE needs SIE_COE > 0 and more than one camera), PRETRAIN / PRETRAIN_PATH (a timm
    ViT file; positions are resized to the token grid).

    Returns:
        :class:`VisionTransformer` with `out_channels` = the token width.
    """
    spec = _check_config(cfg)
    opts = cfg.MODEL.BACKBONE
    cameras = opts.NUM_CAMERAS if opts.SIE_COE > 0 else 0
    if cameras == -1:
        raise ConfigError("MODEL.BACKBONE.NUM_CAMERAS is -1 (from the training set) but no training set "
                          "filled it in; set it to the training cameras (e.g. 6 for Market1501, 15 for MSMT17)")
    model = VisionTransformer(spec, img_size=tuple(cfg.INPUT.SIZE_TRAIN), stride=tuple(opts.STRIDE_SIZE),
                              drop=opts.DROP_RATIO, attn_drop=opts.ATT_DROP_RATE, drop_path=opts.DROP_PATH_RATIO,
                              num_cameras=cameras, sie_coe=opts.SIE_COE)
    if opts.PRETRAIN:
        load_vit_imagenet_weights(model, opts.PRETRAIN_PATH)
    return model


build_vit_backbone.check_config = _check_config
