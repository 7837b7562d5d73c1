"""ResNet backbones: shapes for each depth/option, IBN/NL placement, pretrained loading."""
import logging

import pytest
import torch
from torch import nn

from reid_engine.modeling import build_backbone
from reid_engine.modeling.backbones import RESNET_DEPTHS, ResNet, load_imagenet_weights
from reid_engine.modeling.backbones.build import BACKBONE_REGISTRY
from reid_engine.modeling.layers import IBN, FrozenBatchNorm2d, NonLocal
from reid_engine.utils.errors import ReidUserError
from reid_engine.utils.registry import UnknownChoiceError

from ._helpers import tiny_cfg

# 32x16 input -> conv1 16x8 -> maxpool (fast-reid's: kernel 3, stride 2, no padding, ceil
# mode) 8x4 -> layer2 4x2 -> layer3 2x1 -> layer4: 2x1 with last stride 1, 1x1 with 2.
_MAP_SIZE = {1: (2, 1), 2: (1, 1)}
_IMAGES = torch.randn(2, 3, 32, 16, generator=torch.Generator().manual_seed(0))


def _backbone(depth="18x", **opts):
    return build_backbone(tiny_cfg(depth, **{f"BACKBONE.{k}": v for k, v in opts.items()}))


@pytest.mark.parametrize("last_stride, final", [(1, (16, 8)), (2, (8, 4))])
def test_stem_and_map_sizes_at_256x128_match_fastreid(last_stride, final):
    """fast-reid's stem pooling has no padding: 256x128 -> 64x32 after the stem (65x33 with padding 1)."""
    model = _backbone("18x", LAST_STRIDE=last_stride).eval()
    pool = model.maxpool
    assert (pool.kernel_size, pool.stride, pool.padding, pool.ceil_mode) == (3, 2, 0, True)
    sizes = {}

    def record(module, inputs, output):
        sizes["stem"] = tuple(output.shape[-2:])

    model.maxpool.register_forward_hook(record)
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 256, 128))
    assert sizes["stem"] == (64, 32)
    assert tuple(out.shape[-2:]) == final


@pytest.mark.slow
@pytest.mark.parametrize("depth, opts", [
    ("18x", {"LAST_STRIDE": 1}),
    ("18x", {"LAST_STRIDE": 2}),
    ("18x", {"WITH_IBN": True}),
    ("18x", {"WITH_SE": True}),
    ("18x", {"NORM": "GN"}),
    ("18x", {"NORM": "FrozenBN"}),
    ("18x", {"NORM": "syncBN"}),
    ("34x", {"WITH_IBN": True, "WITH_SE": True, "LAST_STRIDE": 2}),
])
def test_basic_block_resnets_forward(depth, opts):
    torch.manual_seed(0)
    model = _backbone(depth, **opts)
    out = model(_IMAGES)  # training mode: batch statistics
    assert model.out_channels == 512
    assert out.shape == (2, 512, *_MAP_SIZE[opts.get("LAST_STRIDE", 1)])
    assert torch.isfinite(out).all()


def test_resnet50_with_every_option_forward_and_non_local_positions():
    torch.manual_seed(0)
    model = _backbone("50x", WITH_IBN=True, WITH_SE=True, WITH_NL=True)
    calls = []
    for name, module in model.named_modules():
        if name.count(".") == 1 and name.startswith(("layer2", "layer3", "NL_")):
            module.register_forward_hook(lambda m, i, o, name=name: calls.append(name))
    with torch.no_grad():
        out = model.eval()(_IMAGES[:1])
    assert out.shape == (1, 2048, *_MAP_SIZE[1])
    # fast-reid's positions: after the last 2 blocks of layer2 and the last 3 of layer3
    assert calls == ["layer2.0", "layer2.1", "layer2.2", "NL_2.0", "layer2.3", "NL_2.1",
                     "layer3.0", "layer3.1", "layer3.2", "layer3.3", "NL_3.0",
                     "layer3.4", "NL_3.1", "layer3.5", "NL_3.2"]


@pytest.mark.slow
@pytest.mark.parametrize("depth, blocks", [("101x", (3, 4, 23, 3)), ("152x", (3, 8, 36, 3))])
def test_deep_resnets_are_built_without_running(depth, blocks):
    model = _backbone(depth)
    assert tuple(len(getattr(model, f"layer{i}")) for i in range(1, 5)) == blocks
    assert model.out_channels == 2048 and not hasattr(model, "fc")
    assert RESNET_DEPTHS[depth][1] == blocks


def test_resnet101_non_local_counts():
    model = _backbone("101x", WITH_NL=True)
    assert len(model.NL_2) == 2 and len(model.NL_3) == 9
    assert not hasattr(model, "NL_1") and not hasattr(model, "NL_4")
    assert model.NL_3[0].g.weight.shape == (1, 1024, 1, 1)


def test_ibn_a_placement_follows_ibn_net():
    model = _backbone("50x", WITH_IBN=True)
    for stage in range(1, 5):
        for block in getattr(model, f"layer{stage}"):
            assert isinstance(block.bn1, IBN) == (stage < 4)
            assert not isinstance(block.bn2, IBN)
    assert isinstance(model.bn1, nn.BatchNorm2d)


def test_frozen_bn_backbone_has_no_norm_parameters():
    model = _backbone("18x", NORM="FrozenBN")
    assert isinstance(model.layer1[0].bn1, FrozenBatchNorm2d)
    assert all(".bn" not in name and "downsample.1" not in name
               for name, _ in model.named_parameters())


def test_non_local_width_matches_fastreid_checkpoints():
    model = _backbone("50x", WITH_NL=True)
    assert isinstance(model.NL_2[0], NonLocal)
    assert model.NL_2[1].W[0].weight.shape == (512, 1, 1, 1)


@pytest.mark.parametrize("opts, message", [
    ({"DEPTH": "20x"}, "unknown MODEL.BACKBONE.DEPTH '20x': choose one of 18x, 34x, 50x, 101x, 152x"),
    ({"DEPTH": "18x", "WITH_NL": True}, "non-local blocks are defined for depths 50x, 101x"),
    ({"LAST_STRIDE": 3}, "LAST_STRIDE must be 1 or 2"),
    ({"NORM": "XN"}, "unknown MODEL.BACKBONE.NORM 'XN': choose one of BN, syncBN"),
    # the other registered families are listed too (sorted), so only ResNet's entry is checked
    ({"NAME": "build_vgg"}, "unknown MODEL.BACKBONE.NAME 'build_vgg': choose one of [^;]*build_resnet_backbone"),
    ({"WIDTH_MULT": 0.1}, "WIDTH_MULT 0.1 gives 6.4 stem channels; choose a multiple of 1/32"),
    ({"WIDTH_MULT": 0.5, "PRETRAIN": True}, "weights exist for width 1.0 only; set MODEL.BACKBONE.PRETRAIN False"),
    ({"NAME": "build_osnet_backbone", "DEPTH": "x0_25", "WIDTH_MULT": 0.5},
     "build_osnet_backbone has no width option .*set it to 1.0"),
])
def test_bad_options_are_clear_errors(opts, message):
    with pytest.raises(ReidUserError, match=message) as caught:
        _backbone(**opts)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("opts, message", [
    ({"DEPTH": "7x"}, "unknown MODEL.BACKBONE.DEPTH '7x'"),
    ({"NORM": "bn"}, "unknown MODEL.BACKBONE.NORM 'bn'.*did you mean BN[?]"),
    ({"NAME": "resnet"}, "unknown MODEL.BACKBONE.NAME 'resnet'.*did you mean build_resnet_backbone[?]"),
])
def test_check_backbone_config_rejects_wrong_names_without_building(opts, message):
    cfg = tiny_cfg(**{f"BACKBONE.{k}": v for k, v in opts.items()})
    with pytest.raises(UnknownChoiceError, match=message):
        BACKBONE_REGISTRY.check_config(cfg)
    BACKBONE_REGISTRY.check_config(tiny_cfg())  # the defaults pass


@pytest.mark.parametrize("depth", ["18x", "50x"])
def test_out_channels_matches_the_output_map(depth):
    model = _backbone(depth).eval()
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 64, 32))
    assert isinstance(model.out_channels, int)
    assert out.shape[1] == model.out_channels


@pytest.mark.parametrize("mult", [0.5, 0.75])
def test_width_mult_scales_every_stage_and_the_output(mult):
    model = _backbone("18x", WIDTH_MULT=mult, WITH_IBN=True)
    full = _backbone("18x", WITH_IBN=True)
    assert model.conv1.out_channels == round(64 * mult)
    for stage, planes in enumerate((64, 128, 256, 512), start=1):
        assert getattr(model, f"layer{stage}")[0].conv2.out_channels == round(planes * mult)
    assert model.out_channels == round(512 * mult)
    assert model(_IMAGES).shape == (2, round(512 * mult), *_MAP_SIZE[1])
    n_params = sum(p.numel() for p in model.parameters())
    n_full = sum(p.numel() for p in full.parameters())
    assert n_params / n_full == pytest.approx(mult ** 2, rel=0.02)  # convolutions dominate


# ----------------------------------------------------------------------------- pretrained
def _torchvision_layout(model: ResNet, prefix=""):
    """The state dict a torchvision ResNet of the same depth would save (with fc)."""
    state = {prefix + k: v.clone() for k, v in model.state_dict().items()}
    state[prefix + "fc.weight"] = torch.randn(1000, model.out_channels)
    state[prefix + "fc.bias"] = torch.randn(1000)
    return state


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["plain", "state_dict+module"])
def test_pretrained_torchvision_layout_round_trip(tmp_path, load_logs, wrap):
    torch.manual_seed(1)
    source = _backbone("18x", WITH_SE=False)
    for module in source.modules():  # non-trivial statistics, so that a skip would show
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2)
    if wrap == "plain":
        payload = _torchvision_layout(source)
    else:
        payload = {"state_dict": _torchvision_layout(source, prefix="module.")}
    path = tmp_path / "resnet18-imagenet.pth"
    torch.save(payload, path)
    torch.manual_seed(2)
    loaded = _backbone("18x", PRETRAIN=True, PRETRAIN_PATH=str(path))
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    n = len(source.state_dict())
    assert f"Loaded {n} of {n} model tensors from {path}." in load_logs.text
    assert "Not in the checkpoint" not in load_logs.text      # nothing missing
    assert "not used by the model" not in load_logs.text      # fc.* is dropped silently
    assert all(r.levelno < logging.WARNING for r in load_logs.records)


def test_pretrained_ibn_layout_loads_into_ibn_model_and_reports_the_rest(tmp_path, load_logs):
    torch.manual_seed(3)
    source = _backbone("18x", WITH_IBN=True)
    state = _torchvision_layout(source)
    del state["layer4.1.conv2.weight"]                 # missing
    state["layer9.extra.weight"] = torch.zeros(1)       # unexpected
    state["layer4.1.bn2.bias"] = torch.zeros(7)         # wrong shape
    path = tmp_path / "resnet18_ibn_a.pth"
    torch.save(state, path)
    target = _backbone("18x", WITH_IBN=True)
    result = load_imagenet_weights(target, str(path))
    assert torch.equal(target.layer1[0].bn1.IN.weight, source.layer1[0].bn1.IN.weight)
    assert torch.equal(target.layer3[1].bn1.BN.running_var, source.layer3[1].bn1.BN.running_var)
    assert result.missing_keys == ["layer4.1.conv2.weight", "layer4.1.bn2.bias"]
    assert result.unexpected_keys == ["layer9.extra.weight"]
    assert result.incorrect_shapes == [("layer4.1.bn2.bias", (7,), (512,))]
    text = load_logs.text
    assert "Not in the checkpoint, left as initialized (1):\n  layer4.1.conv2.weight" in text
    assert "In the checkpoint but not used by the model (1):\n  layer9.extra.weight" in text
    assert "layer4.1.bn2.bias: (7,) vs (512,)" in text


def test_pretrained_missing_file_is_one_line_error(tmp_path):
    path = str(tmp_path / "nowhere.pth")
    with pytest.raises(FileNotFoundError) as info:
        _backbone("18x", PRETRAIN=True, PRETRAIN_PATH=path)
    message = str(info.value)
    assert "MODEL.BACKBONE.PRETRAIN_PATH" in message and path in message and "\n" not in message
    assert isinstance(info.value, ReidUserError)


def test_pretrained_empty_path_and_corrupt_file(tmp_path):
    with pytest.raises(ValueError, match="PRETRAIN_PATH is empty") as empty:
        _backbone("18x", PRETRAIN=True, PRETRAIN_PATH="")
    assert isinstance(empty.value, ReidUserError)
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError) as info:
        _backbone("18x", PRETRAIN=True, PRETRAIN_PATH=str(bad))
    assert str(bad) in str(info.value) and "\n" not in str(info.value)
    assert "MODEL.BACKBONE.PRETRAIN_PATH" in str(info.value) and isinstance(info.value, ReidUserError)
