"""RegNet backbones: fast-reid's stages for every DEPTH, last stride, SE option, norms, ImageNet
weights of pycls / torchvision / timm, and one-line errors. (Keys and outputs against fast-reid's
own checkpoints: test_fastreid_goldens.py.)"""
import pytest
import torch
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.modeling import BACKBONE_REGISTRY
from reid_engine.modeling.backbones import REGNET_DEPTHS, WeightsFamilyError, regnet
from reid_engine.modeling.backbones.imagenet_weights import detect_weights_family
from reid_engine.modeling.layers import FrozenBatchNorm2d, GhostBatchNorm
from reid_engine.utils.registry import UnknownChoiceError

from ._pycls_helpers import assert_loads_completely, backbone_cfg, rename, with_random_statistics

NAME = "build_regnet_backbone"

# (width, blocks, group width) of s1..s4 as fast-reid 1.4 builds each DEPTH (in a fresh process).
FASTREID_STAGES = {
    "200x": [(24, 1, 8), (56, 1, 8), (152, 4, 8), (368, 7, 8)],
    "200y": [(24, 1, 8), (56, 1, 8), (152, 4, 8), (368, 7, 8)],
    "400x": [(32, 1, 16), (64, 2, 16), (160, 7, 16), (384, 12, 16)],
    "400y": [(48, 1, 8), (104, 3, 8), (208, 6, 8), (440, 6, 8)],
    "800x": [(64, 1, 16), (128, 3, 16), (288, 7, 16), (672, 5, 16)],
    "800y": [(64, 1, 16), (128, 3, 16), (320, 8, 16), (768, 2, 16)],
    "1600x": [(72, 2, 24), (168, 4, 24), (408, 10, 24), (912, 2, 24)],
    "1600y": [(48, 2, 24), (120, 6, 24), (336, 17, 24), (888, 2, 24)],
    "3200x": [(96, 2, 48), (192, 6, 48), (432, 15, 48), (1008, 2, 48)],
    "3200y": [(72, 2, 24), (216, 5, 24), (576, 13, 24), (1512, 1, 24)],
    "4000x": [(80, 2, 40), (240, 5, 40), (560, 14, 40), (1360, 2, 40)],
    "4000y": [(128, 2, 64), (192, 6, 64), (512, 12, 64), (1088, 2, 64)],
    "6400x": [(168, 2, 56), (392, 4, 56), (784, 10, 56), (1624, 1, 56)],
    "6400y": [(144, 2, 72), (288, 7, 72), (576, 14, 72), (1296, 2, 72)],
}


def _build(depth, seed=0, **opts):
    torch.manual_seed(seed)
    return BACKBONE_REGISTRY.build(NAME, backbone_cfg(NAME, depth, **opts))


def _stages_of(model):
    """(width, blocks, group width) per stage, read off the built modules."""
    stages = []
    for index in range(1, model.num_stages + 1):
        blocks = list(getattr(model, f"s{index}").children())
        conv = blocks[0].f.b
        stages.append((blocks[0].f.c.out_channels, len(blocks), conv.in_channels // conv.groups))
    return stages


def test_depth_table_covers_fastreids_depths():
    assert sorted(REGNET_DEPTHS) == sorted(FASTREID_STAGES)


@pytest.mark.parametrize("depth", sorted(FASTREID_STAGES))
def test_width_rule_gives_fastreids_stages(depth):
    assert regnet.regnet_stages(REGNET_DEPTHS[depth]) == FASTREID_STAGES[depth]


@pytest.mark.slow
@pytest.mark.parametrize("depth", sorted(FASTREID_STAGES))
def test_every_depth_builds_with_fastreids_stages(depth):
    model = _build(depth)  # no forward: the big ones are slow
    assert _stages_of(model) == FASTREID_STAGES[depth]
    assert isinstance(model.out_channels, int) and model.out_channels == FASTREID_STAGES[depth][-1][0]
    has_se = any(".se." in key for key in model.state_dict())
    assert has_se == depth.endswith("y")


# 64x32 -> stem 32x16 -> s1 16x8 -> s2 8x4 -> s3 4x2 -> s4: 4x2 with last stride 1, 2x1 with 2
@pytest.mark.parametrize("depth", ["200x", "200y"])
@pytest.mark.parametrize("last_stride, size", [(1, (4, 2)), (2, (2, 1))])
def test_last_stride_sets_the_fourth_stages_stride(depth, last_stride, size):
    model = _build(depth, LAST_STRIDE=last_stride).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 64, 32))
    assert tuple(out.shape) == (2, model.out_channels, *size)
    assert model.s4.b1.f.b.stride == (last_stride, last_stride)
    assert model.s3.b1.f.b.stride == (2, 2)


def test_with_se_gives_a_regnetx_regnetys_squeeze_excitation():
    """200x and 200y share their widths: with SE the X has exactly the Y's layout."""
    shapes = {k: v.shape for k, v in _build("200x", WITH_SE=True).state_dict().items()}
    assert shapes == {k: v.shape for k, v in _build("200y").state_dict().items()}
    # the squeeze is a quarter of the block's input width (stem 32 for s1.b1, then 24)
    assert shapes["s1.b1.f.se.f_ex.0.weight"] == (8, 24, 1, 1)
    assert shapes["s3.b2.f.se.f_ex.0.weight"] == (38, 152, 1, 1)
    assert not any(".se." in k for k in _build("200x").state_dict())
    # a RegNetY always has its SE; WITH_SE True changes nothing
    assert _build("200y", WITH_SE=True).state_dict().keys() == _build("200y").state_dict().keys()


def test_init_is_pycls():
    model = _build("200x")
    assert model.s4.b1.f.c.weight.std().item() == pytest.approx((2.0 / 368) ** 0.5, rel=0.05)
    assert torch.equal(model.s4.b1.f.c_bn.weight, torch.ones(368))
    assert torch.equal(model.stem.bn.bias, torch.zeros(32))


@pytest.mark.parametrize("norm, norm_type", [("FrozenBN", FrozenBatchNorm2d), ("GhostBN", GhostBatchNorm),
                                             ("syncBN", nn.BatchNorm2d)])
def test_norm_variants(norm, norm_type):
    model = _build("200y", NORM=norm).train()
    norms = [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, FrozenBatchNorm2d))]
    assert norms and all(type(m) is norm_type for m in norms)
    out = model(torch.randn(4, 3, 64, 32))
    assert out.shape == (4, 368, 4, 2) and torch.isfinite(out).all()


def test_group_norm_where_widths_allow_and_a_one_line_error_where_not():
    model = _build("800y", NORM="GN")
    assert isinstance(model.s4.b1.f.c_bn, nn.GroupNorm)
    with pytest.raises(ConfigError, match="GN needs channels divisible by 32, got 24") as caught:
        _build("200x", NORM="GN")
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- ImageNet weights
_TORCHVISION_NAMES = [  # ours -> torchvision's RegNet
    (r"^stem\.conv\.", "stem.0."),
    (r"^stem\.bn\.", "stem.1."),
    (r"^s(\d+)\.b(\d+)\.", lambda m: f"trunk_output.block{m[1]}.block{m[1]}-{int(m[2]) - 1}."),
    (r"\.proj\.", ".proj.0."),
    (r"(-\d+)\.bn\.", r"\1.proj.1."),
    (r"\.f\.([abc])\.", r".f.\1.0."),
    (r"\.f\.([abc])_bn\.", r".f.\1.1."),
    (r"\.f\.se\.f_ex\.0\.", ".f.se.fc1."),
    (r"\.f\.se\.f_ex\.2\.", ".f.se.fc2."),
]
_TIMM_NAMES = [  # ours -> timm's RegNet
    (r"\.f\.([abc])\.", lambda m: f".conv{'abc'.index(m[1]) + 1}.conv."),
    (r"\.f\.([abc])_bn\.", lambda m: f".conv{'abc'.index(m[1]) + 1}.bn."),
    (r"\.f\.se\.f_ex\.0\.", ".se.fc1."),
    (r"\.f\.se\.f_ex\.2\.", ".se.fc2."),
    (r"^(s\d+\.b\d+)\.proj\.", r"\1.downsample.conv."),
    (r"^(s\d+\.b\d+)\.bn\.", r"\1.downsample.bn."),
]


def _release(model, layout):
    """The state dict of `model` as the release `layout` saves it, classifier included."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    classifier = {"weight": torch.randn(1000, model.out_channels), "bias": torch.randn(1000)}
    if layout == "pycls":
        state.update({f"head.fc.{k}": v for k, v in classifier.items()})
        return {"epoch": 100, "model_state": state, "cfg": "MODEL:\n  TYPE: regnet\n",
                "optimizer_state": {"state": {}, "param_groups": [{"lr": 0.8, "params": [0, 1]}]}}
    if layout == "torchvision":
        state = rename(state, _TORCHVISION_NAMES)
        state.update({f"fc.{k}": v for k, v in classifier.items()})
        assert "trunk_output.block1.block1-0.proj.1.running_var" in state
        return state
    state = rename(state, _TIMM_NAMES)
    state.update({f"head.fc.{k}": v for k, v in classifier.items()})
    assert "s1.b1.downsample.bn.running_var" in state and "s1.b1.conv1.conv.weight" in state
    return state


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["pycls", "torchvision", "timm"])
def test_imagenet_release_layouts_load_completely(tmp_path, load_logs, layout):
    depth = "200y"  # projections and SE: every renamed part
    source = with_random_statistics(_build(depth, seed=3))
    payload = _release(source, layout)
    assert detect_weights_family(payload.get("model_state", payload)) == "RegNet"
    assert_loads_completely(NAME, depth, source, payload, tmp_path / f"regnet_{layout}.pth", load_logs)


@pytest.mark.slow
def test_file_of_other_widths_is_refused_in_one_line(tmp_path):
    """As torchvision's regnet_y_800mf is for 800y: the names fit, some widths do not."""
    state = _release(_build("200y"), "torchvision")
    state["trunk_output.block4.block4-6.f.c.1.bias"] = torch.zeros(384)
    path = tmp_path / "regnet_y_other.pth"
    torch.save(state, path)
    with pytest.raises(WeightsFamilyError, match=r"1 tensors of other shapes than RegNet 200y "
                                                 r"\(first: s4\.b7\.f\.c_bn\.bias \(384,\) vs \(368,\)\)") as caught:
        _build("200y", PRETRAIN=True, PRETRAIN_PATH=str(path))
    assert "pycls's or timm's ImageNet file" in str(caught.value) and "\n" not in str(caught.value)


def _resnet18_file(path):
    resnet = BACKBONE_REGISTRY.build("build_resnet_backbone", backbone_cfg("build_resnet_backbone", "18x"))
    torch.save(dict(resnet.state_dict(), **{"fc.weight": torch.zeros(1000, 512)}), path)


def _effnet_pycls_file(path):
    effnet = BACKBONE_REGISTRY.build("build_effnet_backbone", backbone_cfg("build_effnet_backbone", "b0"))
    torch.save({"model_state": effnet.state_dict(), "epoch": 1}, path)


@pytest.mark.parametrize("make_file, family", [(_resnet18_file, "ResNet"), (_effnet_pycls_file, "EfficientNet")])
def test_file_of_another_family_names_both(tmp_path, make_file, family):
    path = tmp_path / "other.pth"
    make_file(path)
    with pytest.raises(WeightsFamilyError, match=f"holds {family} weights, but the backbone is RegNet") as caught:
        _build("200x", PRETRAIN=True, PRETRAIN_PATH=str(path))
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("opts, error, message", [
    ({"DEPTH": "1600z"}, UnknownChoiceError,
     r"unknown MODEL.BACKBONE.DEPTH '1600z': choose one of 200x, 200y, .*6400y.*did you mean"),
    ({"WITH_IBN": True}, ConfigError, r"MODEL.BACKBONE.WITH_IBN is True, but build_regnet_backbone .*\(it has WITH_SE\)"),
    ({"WITH_NL": True}, ConfigError, r"MODEL.BACKBONE.WITH_NL is True, but build_regnet_backbone .*\(it has WITH_SE\)"),
    ({"LAST_STRIDE": 4}, ConfigError, "LAST_STRIDE must be 1 or 2"),
])
def test_bad_options_are_one_line_errors(opts, error, message):
    with pytest.raises(error, match=message) as caught:
        _build(opts.pop("DEPTH", "200x"), **opts)
    assert "\n" not in str(caught.value)
