"""Pieces shared by the mobile backbones (MobileNetV2, MobileNetV3, ShuffleNetV2): channel
rounding, the conv-norm-activation unit, their weight init, and the reading of timm's
MobileNet weight files."""
import re
from typing import Callable, Dict, Mapping, Optional, Set, Tuple, Type

from torch import Tensor, nn

from ..layers import get_norm
from .imagenet_weights import StateDict

__all__ = ["make_divisible", "conv_norm_act", "rename_timm_mobilenet", "timm_stage_depths"]


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round a channel count to the nearest multiple of `divisor` (at least `divisor`), going up
    one step where the nearest multiple would lose more than 10% (the MobileNet rule).

    Args:
        value: the channel count before rounding (e.g. width multiplier x base channels).
        divisor: the multiple to round to.

    Returns:
        The rounded channel count.
    """
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def conv_norm_act(in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1, *,
                  groups: int = 1, norm: str = "BN",
                  activation: Optional[Type[nn.Module]] = nn.ReLU) -> nn.Sequential:
    """A bias-free conv ("same" padding for odd kernels), a norm and an activation, as
    `nn.Sequential` indices 0 / 1 / 2 (the key layout of torchvision's and fast-reid's mobile
    nets). Unpack it (`*conv_norm_act(...)`) where a layout keeps the layers flat.

    Args:
        in_channels, out_channels: channels in and out.
        kernel_size, stride, groups: of the conv (groups = channels for a depthwise conv).
        norm: norm name for get_norm (MODEL.BACKBONE.NORM).
        activation: an activation class taking `inplace`, or None for a linear unit
            (then the sequence is conv and norm only).

    Returns:
        nn.Sequential(conv, norm[, activation]).
    """
    layers = [nn.Conv2d(in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2,
                        groups=groups, bias=False),
              get_norm(norm, out_channels)]
    if activation is not None:
        layers.append(activation(inplace=True))
    return nn.Sequential(*layers)


# ----------------------------------------------------------------------------- timm files
# timm's MobileNet files: conv_stem / bn1, blocks.<stage>.<block>.<layer>.*, conv_head (/ bn2),
# classifier. A block's layers tell its type; these are its (conv, norm) units and its
# squeeze-excitation in forward order.
_TIMM_BLOCK_UNITS = {
    "inverted_residual": (("conv_pw", "bn1"), ("conv_dw", "bn2"), "se", ("conv_pwl", "bn3")),
    "depthwise_separable": (("conv_dw", "bn1"), "se", ("conv_pw", "bn2")),
}
_TIMM_SE_LAYERS = {"conv_reduce": "se_reduce", "conv_expand": "se_expand"}
_TIMM_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(\d+)\.([^.]+)\.(.+)")

#: (block, unit, kind) -> our module name, or None for a layer we do not have (the key is then
#: kept, and reported as unused). block: 0 the stem, 1.. timm's blocks in order, -1 the head conv;
#: unit: index in the block, None where the block is one conv-norm layer; kind: "conv", "norm",
#: "se_reduce" or "se_expand".
UnitNamer = Callable[[int, Optional[int], str], Optional[str]]


def _timm_layer_places(layers: Set[str]) -> Dict[str, Tuple[Optional[int], str]]:
    """A timm block's layer names -> (unit index or None, kind)."""
    if "conv_pwl" in layers:
        units = _TIMM_BLOCK_UNITS["inverted_residual"]
    elif "conv_dw" in layers:
        units = _TIMM_BLOCK_UNITS["depthwise_separable"]
    else:  # a plain conv-norm-act block (ConvBnAct: conv, bn1)
        return {"conv": (None, "conv"), "bn1": (None, "norm")}
    units = [unit for unit in units if unit != "se" or "se" in layers]
    places = {}
    for index, unit in enumerate(units):
        if unit == "se":
            places["se"] = (index, "se")
        else:
            places[unit[0]] = (index, "conv")
            places[unit[1]] = (index, "norm")
    return places


def rename_timm_mobilenet(state: StateDict, name_of: UnitNamer) -> StateDict:
    """Rename the keys of a timm MobileNet file (mobilenetv2_*, mobilenetv3_*) to ours.

    The stem (conv_stem, bn1), the blocks (numbered in order across timm's stages) and the
    head conv (conv_head with bn2, where the file has bn2) are renamed by `name_of`; other
    keys (the classifier, a norm-free conv_head) are kept as they are, for the caller to drop.

    Args:
        state: the file's state dict.
        name_of: (block, unit, kind) -> our module name (see UnitNamer).

    Returns:
        The renamed state dict.
    """
    layers_of: Dict[Tuple[int, int], Set[str]] = {}
    for key in state:
        match = _TIMM_BLOCK_KEY.fullmatch(key)
        if match:
            layers_of.setdefault((int(match[1]), int(match[2])), set()).add(match[3])
    block_index = {block: index for index, block in enumerate(sorted(layers_of), start=1)}
    places = {block: _timm_layer_places(layers) for block, layers in layers_of.items()}
    top_level = {"conv_stem": (0, "conv"), "bn1": (0, "norm")}
    if "bn2.weight" in state:
        top_level.update({"conv_head": (-1, "conv"), "bn2": (-1, "norm")})

    renamed = {}
    for key, value in state.items():
        layer, _, rest = key.partition(".")
        match = _TIMM_BLOCK_KEY.fullmatch(key)
        name = None
        if layer in top_level:
            name = name_of(top_level[layer][0], None, top_level[layer][1])
        elif match:
            block = (int(match[1]), int(match[2]))
            unit, kind = places[block].get(match[3], (None, ""))
            rest = match[4]
            if kind == "se":
                se_layer, _, rest = rest.partition(".")
                kind = _TIMM_SE_LAYERS.get(se_layer, se_layer)
            name = name_of(block_index[block], unit, kind) if kind else None
        renamed[f"{name}.{rest}" if name else key] = value
    return renamed


def timm_stage_depths(state: Mapping[str, Tensor]) -> Tuple[int, ...]:
    """Blocks per stage of a timm MobileNet / EfficientNet file (its architecture's signature,
    e.g. (1, 2, 3, 4, 3, 3, 1) for mobilenetv2_*); () for other files."""
    blocks: Dict[int, Set[int]] = {}
    for key in state:
        match = _TIMM_BLOCK_KEY.fullmatch(key)
        if match:
            blocks.setdefault(int(match[1]), set()).add(int(match[2]))
    return tuple(len(blocks[stage]) for stage in sorted(blocks))
