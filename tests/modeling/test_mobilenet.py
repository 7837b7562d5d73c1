"""MobileNetV2 (1.0x-0.1x) and MobileNetV3 (Large / Small) backbones: every DEPTH, LAST_STRIDE
(no effect, as in fast-reid), NORM, ImageNet files of torchvision / timm / tonylins, and the
configuration errors. Outputs equal to fast-reid's are checked in test_fastreid_goldens.py."""

import pytest
import torch
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.modeling.backbones import (
    BACKBONE_REGISTRY,
    MOBILENETV2_DEPTHS,
    WeightsFamilyError,
)
from reid_engine.modeling.backbones.imagenet_weights import WEIGHT_FAMILIES, detect_weights_family
from reid_engine.modeling.layers import FrozenBatchNorm2d, GhostBatchNorm
from reid_engine.utils.registry import UnknownChoiceError

from ._helpers import tiny_cfg

V2 = "build_mobilenetv2_backbone"
V3 = "build_mobilenetv3_backbone"
# timm's blocks per stage (mobilenetv2_*, mobilenetv3_small_*)
TIMM_V2_STAGES = (1, 2, 3, 4, 3, 3, 1)
TIMM_V3_SMALL_STAGES = (1, 2, 3, 2, 3, 1)


pytestmark = pytest.mark.usefixtures("two_torch_threads")


def _cfg(name, depth, **opts):
    cfg = tiny_cfg(depth)
    cfg.MODEL.BACKBONE.NAME = name
    for key, value in opts.items():
        setattr(cfg.MODEL.BACKBONE, key, value)
    return cfg


def _backbone(name, depth, **opts):
    return BACKBONE_REGISTRY.build(name, _cfg(name, depth, **opts))


def _with_statistics(model):
    """Non-trivial norm statistics and affine values, so that a tensor left out would show."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2)
            module.bias.data.normal_()
    return model


# ----------------------------------------------------------------------------- architecture
@pytest.mark.parametrize("name,depth,channels", [(V2, d, 1280) for d in MOBILENETV2_DEPTHS]
                         + [(V3, "Large", 1280), (V3, "Small", 1024)])
def test_every_depth_builds_with_its_out_channels(name, depth, channels):
    model = _backbone(name, depth)
    assert model.out_channels == channels
    assert model.conv[0].out_channels == channels  # the last conv gives the output


@pytest.mark.parametrize("name,depth", [(V2, "0.1x"), (V2, "0.35x"), (V3, "Small")])
@pytest.mark.parametrize("last_stride", [1, 2])
def test_stride_32_whatever_last_stride_like_fastreid(name, depth, last_stride):
    model = _backbone(name, depth, LAST_STRIDE=last_stride).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 32))
    assert out.shape == (1, model.out_channels, 2, 1)


def test_widths_follow_fastreid_rounding():
    # 0.1x rounds to multiples of 4 (stem 4, first block 4), the others to 8; the last conv stays 1280
    assert _backbone(V2, "0.1x").features[0][0].out_channels == 4
    assert _backbone(V2, "0.35x").features[1].conv[-2].out_channels == 8
    assert _backbone(V2, "0.75x").features[-1].conv[-2].out_channels == 240


def test_mobilenetv3_blocks_use_hard_swish_and_hard_sigmoid_squeeze_excitation():
    model = _backbone(V3, "Small")
    assert isinstance(model.features[0][2], nn.Hardswish)
    assert isinstance(model.features[2].block[0][2], nn.ReLU)     # "RE" block
    assert isinstance(model.features[4].block[0][2], nn.Hardswish)  # "HS" block
    assert model.features[1].block[1].fc1.weight.shape == (8, 16, 1, 1)
    assert isinstance(model.conv[2], nn.ReLU6)  # fast-reid's extra conv


@pytest.mark.parametrize("norm,kind", [("FrozenBN", FrozenBatchNorm2d), ("GhostBN", GhostBatchNorm),
                                       ("syncBN", nn.BatchNorm2d)])
@pytest.mark.parametrize("name,depth", [(V2, "0.1x"), (V3, "Small")])
def test_every_norm_layer_follows_norm(name, depth, norm, kind):
    model = _backbone(name, depth, NORM=norm).train()
    norms = [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, FrozenBatchNorm2d))]
    assert norms and all(isinstance(m, kind) for m in norms)  # the projections' norms too
    out = model(torch.randn(4, 3, 64, 32))
    assert out.shape == (4, model.out_channels, 2, 1) and torch.isfinite(out).all()


def test_gn_on_narrow_layers_is_a_one_line_error():
    with pytest.raises(ConfigError, match="GN needs channels divisible by 32") as caught:
        _backbone(V2, "1.0x", NORM="GN")
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("name,choices", [(V2, "1.0x, 0.75x, 0.5x, 0.35x, 0.25x, 0.1x"), (V3, "Large, Small")])
def test_unknown_depth_is_one_line_error_naming_the_choices(name, choices):
    with pytest.raises(UnknownChoiceError, match=f"MODEL.BACKBONE.DEPTH '50x': choose one of {choices}") as caught:
        _backbone(name, "50x")
    assert "\n" not in str(caught.value)


def test_close_depth_is_suggested():
    with pytest.raises(UnknownChoiceError, match="did you mean Large[?]"):
        _backbone(V3, "large")


@pytest.mark.parametrize("name,depth", [(V2, "0.35x"), (V3, "Small")])
@pytest.mark.parametrize("key", ["WITH_IBN", "WITH_NL", "WITH_SE"])
def test_variants_are_one_line_config_errors(name, depth, key):
    with pytest.raises(ConfigError, match=f"MODEL.BACKBONE.{key} is True, but {name} has no such variant") as caught:
        _backbone(name, depth, **{key: True})
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- ImageNet files
def _timm_block_names(stages):
    """Our block index (1-based) -> timm's "blocks.S.B" for stages of these block counts."""
    names = [f"blocks.{stage}.{block}" for stage, count in enumerate(stages) for block in range(count)]
    return dict(enumerate(names, start=1))


def _v2_torchvision_layout(state):
    """Our MobileNetV2 keys -> torchvision's mobilenet_v2 (plus its classifier)."""
    last = 1 + sum(count for count in TIMM_V2_STAGES)
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "conv":
            key = ".".join(["features", str(last)] + parts[1:])
        elif parts[0] == "features" and parts[1] != "0":
            units = 1 if parts[1] == "1" else 2  # conv-norm-act units before the linear projection
            unit, layer = divmod(int(parts[3]), 3)
            index = [str(unit), str(layer)] if unit < units else [str(units + layer)]
            key = ".".join(parts[:3] + index + parts[4:])
        out[key] = value.clone()
    out["classifier.1.weight"] = torch.randn(1000, 1280)
    out["classifier.1.bias"] = torch.randn(1000)
    return out


# our flat conv index -> timm's layer, by block type
_TIMM_V2_LAYERS = {1: {0: "conv_dw", 1: "bn1", 3: "conv_pw", 4: "bn2"},
                   2: {0: "conv_pw", 1: "bn1", 3: "conv_dw", 4: "bn2", 6: "conv_pwl", 7: "bn3"}}


def _v2_timm_layout(state):
    """Our MobileNetV2 keys -> timm's mobilenetv2_* (plus its classifier)."""
    blocks = _timm_block_names(TIMM_V2_STAGES)
    top = {"features.0.0": "conv_stem", "features.0.1": "bn1", "conv.0": "conv_head", "conv.1": "bn2"}
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        depth = 3 if parts[0] == "features" else 2  # "features.0.0" / "conv.0"
        if ".".join(parts[:depth]) in top:
            key = ".".join([top[".".join(parts[:depth])]] + parts[depth:])
        else:
            layers = _TIMM_V2_LAYERS[1 if parts[1] == "1" else 2]
            key = ".".join([blocks[int(parts[1])], layers[int(parts[3])]] + parts[4:])
        out[key] = value.clone()
    out["classifier.weight"] = torch.randn(1000, 1280)
    out["classifier.bias"] = torch.randn(1000)
    return out


def _v3_torchvision_layout(state):
    """Our MobileNetV3 keys -> torchvision's (the same, without fast-reid's conv, plus the classifier)."""
    out = {k: v.clone() for k, v in state.items() if not k.startswith("conv.")}
    out.update({"classifier.0.weight": torch.randn(1024, 576), "classifier.0.bias": torch.randn(1024),
                "classifier.3.weight": torch.randn(1000, 1024), "classifier.3.bias": torch.randn(1000)})
    return out


def _v3_timm_layout(state, stages=TIMM_V3_SMALL_STAGES):
    """Our MobileNetV3 keys -> timm's mobilenetv3_* (plus its biased head conv and classifier)."""
    blocks = _timm_block_names(stages)
    last = len(blocks)  # timm's last "block" is the plain 1x1 conv (our features.N)
    units = {}  # block -> our conv unit indices (the SE has fc1 / fc2 instead)
    for key in state:
        parts = key.split(".")
        if parts[0] == "features" and parts[2] == "block" and parts[4] in ("0", "1"):
            units.setdefault(int(parts[1]), set()).add(int(parts[3]))
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "conv":  # fast-reid's extra conv: in no release
            continue
        block = int(parts[1])
        if block == 0:
            key = ".".join([{"0": "conv_stem", "1": "bn1"}[parts[2]]] + parts[3:])
        elif block == last:
            key = ".".join([blocks[block], {"0": "conv", "1": "bn1"}[parts[2]]] + parts[3:])
        elif parts[4] in ("fc1", "fc2"):
            key = ".".join([blocks[block], "se", {"fc1": "conv_reduce", "fc2": "conv_expand"}[parts[4]]] + parts[5:])
        else:
            names = ([("conv_dw", "bn1"), ("conv_pw", "bn2")] if len(units[block]) == 2
                     else [("conv_pw", "bn1"), ("conv_dw", "bn2"), ("conv_pwl", "bn3")])
            position = sorted(units[block]).index(int(parts[3]))
            key = ".".join([blocks[block], names[position][int(parts[4])]] + parts[5:])
        out[key] = value.clone()
    out.update({"conv_head.weight": torch.randn(1024, 576, 1, 1), "conv_head.bias": torch.randn(1024),
                "classifier.weight": torch.randn(1000, 1024), "classifier.bias": torch.randn(1000)})
    return out


def _v2_tonylins_layout(state):
    """tonylins' (and fast-reid's) MobileNetV2 file: our keys, under "state_dict" with "module."."""
    out = {f"module.{k}": v.clone() for k, v in state.items()}
    out.update({"module.classifier.weight": torch.randn(1000, 1280), "module.classifier.bias": torch.randn(1000)})
    return {"state_dict": out}


RELEASES = {  # release -> (builder, DEPTH, layout maker, our keys no release holds)
    "v2-torchvision": (V2, "1.0x", _v2_torchvision_layout, ()),
    "v2-timm": (V2, "0.35x", _v2_timm_layout, ()),
    "v2-tonylins": (V2, "0.35x", _v2_tonylins_layout, ()),
    "v3-torchvision": (V3, "Small", _v3_torchvision_layout, ("conv.",)),
    "v3-timm": (V3, "Small", _v3_timm_layout, ("conv.",)),
}


@pytest.mark.slow
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_imagenet_release_layout_loads_every_tensor(release, tmp_path, load_logs):
    name, depth, layout, not_released = RELEASES[release]
    torch.manual_seed(1)
    source = _with_statistics(_backbone(name, depth))
    path = tmp_path / f"{release}.pth"
    torch.save(layout(source.state_dict()), path)
    torch.manual_seed(2)
    loaded = _backbone(name, depth, PRETRAIN=True, PRETRAIN_PATH=str(path))
    released = {k: v for k, v in source.state_dict().items() if not k.startswith(not_released or ("-",))}
    for key, value in released.items():
        assert torch.equal(loaded.state_dict()[key], value), key
    total = len(source.state_dict())
    # the loader does not count a missing num_batches_tracked
    missing = [k for k in source.state_dict() if k not in released and not k.endswith("num_batches_tracked")]
    assert f"Loaded {total - len(missing)} of {total} model tensors from {path}." in load_logs.text
    assert "not used by the model" not in load_logs.text  # classifiers are dropped silently
    assert "shape" not in load_logs.text
    if not_released:  # fast-reid's extra 1x1 conv is reported as left initialised
        assert "Not in the checkpoint, left as initialized (5):\n  conv.0.weight" in load_logs.text
    else:
        assert "Not in the checkpoint" not in load_logs.text


def _family_files():
    """One state dict per family of the weight files these tests know (as the files hold them)."""
    torch.manual_seed(0)
    files = {"MobileNetV2": [], "MobileNetV3": []}
    for name, depth, layout, _ in RELEASES.values():
        state = layout(_backbone(name, depth).state_dict())
        state = state.get("state_dict", state)
        files["MobileNetV2" if name == V2 else "MobileNetV3"].append(
            {k.replace("module.", "", 1): v for k, v in state.items()})
    files["ResNet"] = [_backbone("build_resnet_backbone", "18x").state_dict()]
    files["ShuffleNetV2"] = [_backbone("build_shufflenetv2_backbone", "0.5x").state_dict()]
    return files


def test_fingerprints_tell_the_families_apart():
    files = _family_files()
    for family, states in files.items():
        for state in states:
            assert detect_weights_family(state) == family
            for other in ("ResNet", "MobileNetV2", "MobileNetV3", "ShuffleNetV2"):
                assert WEIGHT_FAMILIES[other].fingerprint(state) == (other == family), (family, other)


@pytest.mark.parametrize("name,depth,file_family,make_file", [
    (V2, "1.0x", "MobileNetV3", lambda: _v3_torchvision_layout(_backbone(V3, "Small").state_dict())),
    (V3, "Small", "MobileNetV2", lambda: _v2_timm_layout(_backbone(V2, "0.35x").state_dict())),
    (V3, "Large", "ResNet", lambda: _backbone("build_resnet_backbone", "18x").state_dict()),
])
def test_file_of_another_family_is_refused_naming_both(name, depth, file_family, make_file, tmp_path):
    path = tmp_path / "other.pth"
    torch.save(make_file(), path)
    family = "MobileNetV2" if name == V2 else "MobileNetV3"
    with pytest.raises(WeightsFamilyError, match=f"holds {file_family} weights, but the backbone is {family}") as caught:
        _backbone(name, depth, PRETRAIN=True, PRETRAIN_PATH=str(path))
    assert "MODEL.BACKBONE.PRETRAIN_PATH" in str(caught.value) and "\n" not in str(caught.value)


def test_file_of_another_width_is_refused(tmp_path):
    path = tmp_path / "mobilenetv2_100.pth"
    torch.save(_v2_timm_layout(_backbone(V2, "1.0x").state_dict()), path)
    with pytest.raises(WeightsFamilyError, match="same MODEL.BACKBONE.DEPTH"):
        _backbone(V2, "0.35x", PRETRAIN=True, PRETRAIN_PATH=str(path))
