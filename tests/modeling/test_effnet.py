"""EfficientNet backbones: the b0-b7 table (fast-reid's b0-b5, compound scaling for all), last
stride, drop connect, norms, ImageNet weights of pycls / torchvision / timm, and one-line
errors. (Keys and outputs against fast-reid's own checkpoints: test_fastreid_goldens.py.)"""
import math
import re

import pytest
import torch
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.modeling import BACKBONE_REGISTRY
from reid_engine.modeling.backbones import EFFNET_DEPTHS, EffNet, WeightsFamilyError, effnet
from reid_engine.modeling.backbones.effnet import EffNetSpec
from reid_engine.modeling.backbones.imagenet_weights import detect_weights_family
from reid_engine.modeling.layers import FrozenBatchNorm2d, GhostBatchNorm
from reid_engine.utils.registry import UnknownChoiceError

from ._pycls_helpers import assert_loads_completely, backbone_cfg, rename, with_random_statistics

NAME = "build_effnet_backbone"

# (stem width, blocks per stage, widths per stage, head width) as fast-reid 1.4 builds b0-b5.
FASTREID_MODELS = {
    "b0": (32, [1, 2, 2, 3, 3, 4, 1], [16, 24, 40, 80, 112, 192, 320], 1280),
    "b1": (32, [2, 3, 3, 4, 4, 5, 2], [16, 24, 40, 80, 112, 192, 320], 1280),
    "b2": (32, [2, 3, 3, 4, 4, 5, 2], [16, 24, 48, 88, 120, 208, 352], 1408),
    "b3": (40, [2, 3, 3, 5, 5, 6, 2], [24, 32, 48, 96, 136, 232, 384], 1536),
    "b4": (48, [2, 4, 4, 6, 6, 8, 2], [24, 32, 56, 112, 160, 272, 448], 1792),
    "b5": (48, [3, 5, 5, 7, 7, 9, 3], [24, 40, 64, 128, 176, 304, 512], 2048),
}
# EfficientNet's (width, depth) multipliers of b1..b7 over b0 (Tan & Le, 2019).
COMPOUND_SCALING = {"b1": (1.0, 1.1), "b2": (1.1, 1.2), "b3": (1.2, 1.4), "b4": (1.4, 1.8),
                    "b5": (1.6, 2.2), "b6": (1.8, 2.6), "b7": (2.0, 3.1)}


def _build(depth, seed=0, **opts):
    torch.manual_seed(seed)
    return BACKBONE_REGISTRY.build(NAME, backbone_cfg(NAME, depth, **opts))


def _structure_of(model):
    """(stem width, blocks per stage, widths per stage, head width), read off the modules."""
    stages = [list(getattr(model, f"s{i}").children()) for i in range(1, model.num_stages + 1)]
    return (model.stem.conv.out_channels, [len(blocks) for blocks in stages],
            [blocks[-1].lin_proj.out_channels for blocks in stages], model.head.conv.out_channels)


def test_table_holds_fastreids_models():
    for depth, (stem_w, depths, widths, head_w) in FASTREID_MODELS.items():
        assert EFFNET_DEPTHS[depth] == EffNetSpec(stem_w, tuple(depths), tuple(widths), head_w)
    assert sorted(EFFNET_DEPTHS) == [f"b{i}" for i in range(8)]


def _round_width(width, multiplier, quantum=8):
    """EfficientNet's width rounding: nearest multiple of 8, but not below 90% of the target."""
    target = width * multiplier
    rounded = max(quantum, int(target + quantum / 2) // quantum * quantum)
    return rounded + quantum if rounded < 0.9 * target else rounded


@pytest.mark.parametrize("depth", sorted(COMPOUND_SCALING))
def test_every_row_is_b0_compound_scaled(depth):
    """b1-b5 (fast-reid's files) and b6/b7 (not in fast-reid) follow the same rule."""
    width_mult, depth_mult = COMPOUND_SCALING[depth]
    b0 = EFFNET_DEPTHS["b0"]
    assert EFFNET_DEPTHS[depth] == EffNetSpec(
        _round_width(b0.stem_w, width_mult), tuple(math.ceil(d * depth_mult) for d in b0.depths),
        tuple(_round_width(w, width_mult) for w in b0.widths), _round_width(b0.head_w, width_mult))


@pytest.mark.slow
@pytest.mark.parametrize("depth", sorted(EFFNET_DEPTHS))
def test_every_depth_builds_with_its_widths(depth):
    model = _build(depth)  # no forward: the big ones are slow
    spec = EFFNET_DEPTHS[depth]
    assert _structure_of(model) == (spec.stem_w, list(spec.depths), list(spec.widths), spec.head_w)
    assert isinstance(model.out_channels, int) and model.out_channels == spec.head_w
    # stage 1 does not expand (no exp conv), the others expand 6x
    assert model.s1.b1.exp is None and model.s2.b1.exp.out_channels == 6 * spec.widths[0]
    # the SE squeezes a quarter of the block's input width
    assert model.s2.b1.se.f_ex[0].out_channels == spec.widths[0] // 4


# 64x32 -> stem 32x16 -> s2 16x8 -> s3 8x4 -> s4 4x2 -> s6: 4x2 with last stride 1, 2x1 with 2
@pytest.mark.parametrize("last_stride, size", [(1, (4, 2)), (2, (2, 1))])
def test_last_stride_sets_stage_s6s_stride(last_stride, size):
    model = _build("b0", LAST_STRIDE=last_stride).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 64, 32))
    assert tuple(out.shape) == (2, 1280, *size)
    assert model.s6.b1.dwise.stride == (last_stride, last_stride)
    assert model.s4.b1.dwise.stride == (2, 2) and model.s7.b1.dwise.stride == (1, 1)


def test_drop_connect_only_in_training():
    spec = EffNetSpec(8, (1, 2, 1, 1, 2, 1, 1), (8, 8, 16, 16, 16, 24, 24), 32)
    torch.manual_seed(0)
    dropping = EffNet(spec, drop_connect=0.5)
    plain = EffNet(spec)
    plain.load_state_dict(dropping.state_dict())
    images = torch.randn(4, 3, 32, 16)
    with torch.no_grad():
        torch.testing.assert_close(dropping.eval()(images), plain.eval()(images), rtol=0, atol=0)
        dropping.train()
        plain.train()
        torch.manual_seed(1)
        first = dropping(images)
        torch.manual_seed(2)
        assert not torch.equal(first, dropping(images))  # another mask
        torch.manual_seed(3)
        no_drop = plain(images)
        torch.manual_seed(4)
        assert torch.equal(no_drop, plain(images))
    # fast-reid's EN files leave the rate at 0: its models never drop
    assert all(block.drop_connect == 0.0 for block in _build("b0").modules() if isinstance(block, effnet.MBConv))


def test_init_is_pycls():
    model = _build("b0")
    assert model.head.conv.weight.std().item() == pytest.approx((2.0 / 1280) ** 0.5, rel=0.05)
    assert torch.equal(model.head.conv_bn.weight, torch.ones(1280))
    assert torch.equal(model.s7.b1.lin_proj_bn.bias, torch.zeros(320))


@pytest.mark.parametrize("norm, norm_type", [("FrozenBN", FrozenBatchNorm2d), ("GhostBN", GhostBatchNorm),
                                             ("syncBN", nn.BatchNorm2d)])
def test_norm_variants(norm, norm_type):
    model = _build("b0", NORM=norm).train()
    norms = [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, FrozenBatchNorm2d))]
    assert norms and all(type(m) is norm_type for m in norms)
    out = model(torch.randn(4, 3, 32, 32))
    assert out.shape == (4, 1280, 2, 2) and torch.isfinite(out).all()


def test_group_norm_is_a_one_line_error_for_its_narrow_stages():
    with pytest.raises(ConfigError, match="GN needs channels divisible by 32, got 16") as caught:
        _build("b0", NORM="GN")
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- ImageNet weights
_TORCHVISION_TOP = [(r"^stem\.conv\.", "features.0.0."), (r"^stem\.bn\.", "features.0.1."),
                    (r"^head\.conv\.", "features.8.0."), (r"^head\.conv_bn\.", "features.8.1.")]
_TIMM_TOP = [(r"^stem\.conv\.", "conv_stem."), (r"^stem\.bn\.", "bn1."),
             (r"^head\.conv\.", "conv_head."), (r"^head\.conv_bn\.", "bn2.")]
_TIMM_INVERTED_RESIDUAL = {"exp": "conv_pw", "exp_bn": "bn1", "dwise": "conv_dw", "dwise_bn": "bn2",
                           "lin_proj": "conv_pwl", "lin_proj_bn": "bn3", "se": "se"}
_TIMM_SEPARABLE = {"dwise": "conv_dw", "dwise_bn": "bn1", "lin_proj": "conv_pw", "lin_proj_bn": "bn2", "se": "se"}
_TORCHVISION_SE = {"f_ex.0": "fc1", "f_ex.2": "fc2"}
_TIMM_SE = {"f_ex.0": "conv_reduce", "f_ex.2": "conv_expand"}


def _block_key(state, key, layout):
    """Our s<i>.b<j>.<part>... key in torchvision's or timm's block naming."""
    stage, block, part, rest = key.split(".", 3)
    i, j = int(stage[1:]), int(block[1:])
    expands = f"{stage}.{block}.exp.weight" in state
    if layout == "timm":
        if part == "se":
            layer, rest = rest.rsplit(".", 1)
            local = "se." + _TIMM_SE[layer]
        else:
            local = (_TIMM_INVERTED_RESIDUAL if expands else _TIMM_SEPARABLE)[part]
        return f"blocks.{i - 1}.{j - 1}.{local}.{rest}"
    parts = ("exp", "dwise", "se", "lin_proj") if expands else ("dwise", "se", "lin_proj")
    if part == "se":
        layer, rest = rest.rsplit(".", 1)
        local = f"{parts.index('se')}.{_TORCHVISION_SE[layer]}"
    else:
        name = part[:-3] if part.endswith("_bn") else part
        local = f"{parts.index(name)}.{1 if part.endswith('_bn') else 0}"
    return f"features.{i}.{j - 1}.block.{local}.{rest}"


def _release(model, layout):
    """The state dict of `model` as the release `layout` saves it, classifier included."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    classifier = {"weight": torch.randn(1000, model.out_channels), "bias": torch.randn(1000)}
    if layout == "pycls":
        state.update({f"head.fc.{k}": v for k, v in classifier.items()})
        return {"epoch": 100, "model_state": state, "optimizer_state": {"state": {}, "param_groups": []}}
    blocks = {(_block_key(state, k, layout) if re.match(r"s\d+\.b\d+\.", k) else k): v for k, v in state.items()}
    state = rename(blocks, _TORCHVISION_TOP if layout == "torchvision" else _TIMM_TOP)
    prefix = "classifier.1." if layout == "torchvision" else "classifier."
    state.update({prefix + k: v for k, v in classifier.items()})
    assert {"features.2.0.block.3.1.running_var", "features.1.0.block.1.fc2.bias"} <= set(state) \
        or {"blocks.1.0.bn3.running_var", "blocks.0.0.se.conv_expand.bias"} <= set(state)
    return state


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["pycls", "torchvision", "timm"])
def test_imagenet_release_layouts_load_completely(tmp_path, load_logs, layout):
    source = with_random_statistics(_build("b0", seed=3))
    payload = _release(source, layout)
    assert detect_weights_family(payload.get("model_state", payload)) == "EfficientNet"
    assert_loads_completely(NAME, "b0", source, payload, tmp_path / f"effnet_{layout}.pth", load_logs)


def test_regnet_file_with_the_shared_pycls_names_is_refused_naming_both(tmp_path):
    regnet = BACKBONE_REGISTRY.build("build_regnet_backbone", backbone_cfg("build_regnet_backbone", "200y"))
    path = tmp_path / "RegNetY-200MF_dds_8gpu.pyth"
    torch.save({"model_state": regnet.state_dict(), "epoch": 1}, path)
    with pytest.raises(WeightsFamilyError, match="holds RegNet weights, but the backbone is EfficientNet") as caught:
        _build("b0", PRETRAIN=True, PRETRAIN_PATH=str(path))
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("opts, error, message", [
    ({"DEPTH": "b8"}, UnknownChoiceError, r"unknown MODEL.BACKBONE.DEPTH 'b8': choose one of b0, b1, .*b7"),
    ({"WITH_SE": True}, ConfigError, r"MODEL.BACKBONE.WITH_SE is True, but build_effnet_backbone has no such variant"),
    ({"WITH_IBN": True}, ConfigError, r"MODEL.BACKBONE.WITH_IBN is True, but build_effnet_backbone has no such variant"),
    ({"WITH_NL": True}, ConfigError, r"MODEL.BACKBONE.WITH_NL is True, but build_effnet_backbone has no such variant"),
])
def test_bad_options_are_one_line_errors(opts, error, message):
    with pytest.raises(error, match=message) as caught:
        _build(opts.pop("DEPTH", "b0"), **opts)
    assert "\n" not in str(caught.value)
