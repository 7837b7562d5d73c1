"""OSNet backbones: every DEPTH (OSNet, OSNet-IBN, OSNet-AIN), instance-norm placement,
LAST_STRIDE (no effect, as in fast-reid), norms, torchreid ImageNet files and config errors.
fast-reid's own layouts and outputs are checked in test_fastreid_goldens.py; OSNet-AIN's
against torchreid's here (torchreid_golden/osnet_ain.json, made by make_osnet_ain.py)."""
import json
import logging
import os

import pytest
import torch
from torch import nn

from reid_engine.modeling import build_backbone
from reid_engine.modeling.backbones import OSNET_DEPTHS, WeightsFamilyError, osnet
from reid_engine.modeling.layers import FrozenBatchNorm2d
from reid_engine.utils.errors import ReidUserError

from ._helpers import tiny_cfg
from .fastreid_state import GOLDEN_IMAGE_SIZE, GOLDEN_SEED, backbone_input, golden_images, random_fastreid_state

TORCHREID_GOLDEN = os.path.join(os.path.dirname(__file__), "torchreid_golden", "osnet_ain.json")
_IMAGES = torch.randn(2, 3, 64, 32, generator=torch.Generator().manual_seed(0))
_OUT_CHANNELS = {"x1_0": 512, "x0_75": 384, "x0_5": 256, "x0_25": 128}


pytestmark = pytest.mark.usefixtures("two_torch_threads")


def _cfg(depth="x0_25", **opts):
    cfg = tiny_cfg(depth, **{f"BACKBONE.{k}": v for k, v in opts.items()})
    cfg.MODEL.BACKBONE.NAME = "build_osnet_backbone"
    return cfg


def _osnet(depth="x0_25", seed=0, **opts):
    torch.manual_seed(seed)
    return build_backbone(_cfg(depth, **opts))


def _one_line_config_error(cfg, *parts):
    with pytest.raises(ReidUserError) as info:  # ConfigError, or UnknownChoiceError for a wrong name
        build_backbone(cfg)
    message = str(info.value).strip("'\"")
    assert "\n" not in message and all(part in message for part in parts), message
    return message


@pytest.mark.parametrize("depth", sorted(OSNET_DEPTHS))
def test_every_depth_builds_with_its_width_and_stride_16(depth):
    model = _osnet(depth).eval()
    assert model.out_channels == _OUT_CHANNELS[depth.replace("ain_", "")]
    with torch.no_grad():
        out = model(_IMAGES)
    assert tuple(out.shape) == (2, model.out_channels, 4, 2)


def test_osnet_trunk_layout():
    """conv1 7x7/2, max pool 3x3/2, blocks 2-2-2, transitions inside conv2 / conv3, conv5 1x1."""
    model = _osnet("x1_0")
    assert [name for name, _ in model.named_children()] == ["conv1", "maxpool", "conv2", "conv3", "conv4", "conv5"]
    assert (model.conv1.conv.kernel_size, model.conv1.conv.stride) == ((7, 7), (2, 2))
    assert (model.maxpool.kernel_size, model.maxpool.stride, model.maxpool.padding) == (3, 2, 1)
    assert [len(model.conv2), len(model.conv3), len(model.conv4)] == [3, 3, 2]
    assert isinstance(model.conv2[2][1], nn.AvgPool2d) and isinstance(model.conv3[2][1], nn.AvgPool2d)
    block = model.conv2[0]
    assert block.conv1.conv.out_channels == 64 and block.downsample is not None
    assert [len(block.conv2b), len(block.conv2c), len(block.conv2d)] == [2, 3, 4]
    assert block.conv2a.conv2.groups == 64  # depthwise 3x3
    assert block.gate.fc1.out_channels == 4  # 64 // 16
    assert model.conv5.conv.kernel_size == (1, 1) and model.conv5.conv.out_channels == 512
    assert not any(isinstance(m, nn.InstanceNorm2d) for m in model.modules())


def test_ibn_puts_instance_norm_in_conv1_and_after_the_sum_of_conv2_blocks():
    model = _osnet("x0_25", WITH_IBN=True)
    assert isinstance(model.conv1.bn, nn.InstanceNorm2d) and model.conv1.bn.affine
    assert not model.conv1.bn.track_running_stats  # weight and bias only, as in the files
    blocks = {f"{stage}.{i}": block for stage in ("conv2", "conv3", "conv4")
              for i, block in enumerate(getattr(model, stage)) if isinstance(block, osnet.OSBlock)}
    with_in = sorted(name for name, block in blocks.items() if block.IN is not None)
    assert with_in == ["conv2.0", "conv2.1"]
    assert all(blocks[name].instance_norm == "output" for name in with_in)
    assert all(isinstance(blocks[name].conv3.bn, nn.BatchNorm2d) for name in blocks)


def test_ain_layout_follows_torchreid_osnet_ain():
    """IN in conv1 and closing the residual branch of conv2.0, conv2.1, conv3.1, conv4.0
    (no conv3 norm there); separate pool2 / pool3; streams under conv2.<t>.layers."""
    model = _osnet("ain_x0_25")
    assert [name for name, _ in model.named_children()] == [
        "conv1", "maxpool", "conv2", "pool2", "conv3", "pool3", "conv4", "conv5"]
    assert isinstance(model.conv1.bn, nn.InstanceNorm2d)
    blocks = {f"{stage}.{i}": block for stage in ("conv2", "conv3", "conv4")
              for i, block in enumerate(getattr(model, stage))}
    with_in = sorted(name for name, block in blocks.items() if block.IN is not None)
    assert with_in == ["conv2.0", "conv2.1", "conv3.1", "conv4.0"]
    assert all(blocks[name].instance_norm == "residual" for name in with_in)
    assert all(isinstance(blocks[name].conv3.bn, nn.Identity) for name in with_in)
    assert all(isinstance(blocks[name].conv3.bn, nn.BatchNorm2d) for name in ("conv3.0", "conv4.1"))
    keys = model.state_dict()
    assert "conv2.0.conv2.3.layers.3.conv2.weight" in keys and "pool3.0.conv.weight" in keys
    assert "conv2.0.conv3.bn.weight" not in keys and "conv3.0.conv3.bn.weight" in keys


def _torchreid_golden(depth):
    with open(TORCHREID_GOLDEN) as handle:
        golden = json.load(handle)[depth]
    return golden, {key: tuple(shape) for key, shape in golden["layout"]}


def test_ain_x1_0_layout_equals_torchreid_osnet_ain_trunk():
    """The keys (in order) and shapes of torchreid's osnet_ain_x1_0 without fc / classifier."""
    _, layout = _torchreid_golden("ain_x1_0")
    model = _osnet("ain_x1_0")
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == list(layout.items())


def test_ain_outputs_equal_torchreid():
    golden, layout = _torchreid_golden("ain_x0_25")
    model = _osnet("ain_x0_25")
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == list(layout.items())
    model.load_state_dict(random_fastreid_state(layout, GOLDEN_SEED), strict=True)
    with torch.no_grad():
        out = model.eval()(backbone_input(golden_images(*GOLDEN_IMAGE_SIZE)))
    assert list(out.shape) == golden["shape"]
    torch.testing.assert_close(out.mean((2, 3)), torch.tensor(golden["pooled"]), rtol=0, atol=1e-4)
    torch.testing.assert_close(out.mean(1), torch.tensor(golden["map"]), rtol=0, atol=1e-4)


def test_last_stride_has_no_effect_as_in_fastreid(caplog, monkeypatch):
    """fast-reid's OSNet reads no LAST_STRIDE: conv4 never downsamples (stride 16 always)."""
    monkeypatch.setattr(logging.getLogger("reid_engine"), "propagate", True)
    caplog.set_level(logging.INFO, logger=osnet.__name__)
    one, two = _osnet(LAST_STRIDE=1).eval(), _osnet(LAST_STRIDE=2).eval()
    assert "LAST_STRIDE 2 has no effect on OSNet" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(one(_IMAGES), two(_IMAGES), rtol=0, atol=0)
    _one_line_config_error(_cfg(LAST_STRIDE=3), "MODEL.BACKBONE.LAST_STRIDE")


@pytest.mark.parametrize("depth, opts", [
    ("x1_0", {"NORM": "GN"}),
    ("x0_25", {"NORM": "syncBN"}),
    ("x0_25", {"NORM": "GhostBN"}),
    ("ain_x0_25", {"NORM": "FrozenBN"}),
])
def test_norm_variants_forward(depth, opts):
    model = _osnet(depth, **opts).train()
    out = model(torch.randn(4, 3, 64, 32))
    assert out.shape[1] == model.out_channels and torch.isfinite(out).all()


def test_frozen_bn_leaves_only_convs_and_instance_norms_trainable():
    model = _osnet("x0_25", NORM="FrozenBN", WITH_IBN=True)
    assert isinstance(model.conv5.bn, FrozenBatchNorm2d)
    norms = {name for name, module in model.named_modules() if isinstance(module, nn.InstanceNorm2d)}
    for name, _ in model.named_parameters():
        owner = name.rsplit(".", 1)[0]
        assert owner in norms or isinstance(model.get_submodule(owner), nn.Conv2d), name


# ---- torchreid ImageNet files


def _torchreid_file(model, path, prefix="", wrap=None):
    """Save `model` as torchreid's ImageNet file: the trunk under torchreid's names (ours),
    plus the feature fc (Linear + BatchNorm1d + ReLU) and the 1000-way classifier."""
    width = model.out_channels
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state.update({"fc.0.weight": torch.randn(512, width), "fc.0.bias": torch.randn(512),
                  "fc.1.weight": torch.rand(512), "fc.1.bias": torch.randn(512),
                  "fc.1.running_mean": torch.randn(512), "fc.1.running_var": torch.rand(512),
                  "fc.1.num_batches_tracked": torch.tensor(7), "classifier.weight": torch.randn(1000, 512),
                  "classifier.bias": torch.randn(1000)})
    state = {prefix + k: v for k, v in state.items()}
    torch.save({wrap: state} if wrap else state, path)
    return str(path)


def _with_statistics(model):
    for module in model.modules():  # non-trivial statistics, so that a skip would show
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("depth, opts, wrap", [
    ("x0_25", {}, None),
    ("x0_25", {"WITH_IBN": True}, "state_dict"),
    ("ain_x0_25", {}, None),
])
def test_torchreid_imagenet_file_loads_with_every_tensor_matched(tmp_path, load_logs, depth, opts, wrap):
    source = _with_statistics(_osnet(depth, seed=1, **opts))
    path = _torchreid_file(source, tmp_path / "osnet_imagenet.pth", prefix="module." if wrap else "", wrap=wrap)
    loaded = _osnet(depth, seed=2, PRETRAIN=True, PRETRAIN_PATH=path, **opts)
    loaded_state = loaded.state_dict()
    for key, value in source.state_dict().items():
        assert torch.equal(loaded_state[key], value), key
    n = len(source.state_dict())
    assert f"Loaded {n} of {n} model tensors from {path}." in load_logs.text
    assert "Not in the checkpoint" not in load_logs.text and "not used by the model" not in load_logs.text
    assert all(r.levelno < logging.WARNING for r in load_logs.records)


@pytest.mark.slow
@pytest.mark.parametrize("file_depth, file_opts, depth, opts, names", [
    ("x0_25", {"WITH_IBN": True}, "x0_25", {},
     ("holds OSNet-IBN weights, but the backbone is OSNet ", "osnet_x0_25_imagenet.pth", "WITH_IBN True")),
    ("x0_25", {}, "x0_25", {"WITH_IBN": True},
     ("holds OSNet weights, but the backbone is OSNet-IBN", "osnet_ibn_x0_25_imagenet.pth", "WITH_IBN False")),
    ("x0_25", {}, "ain_x0_25", {},
     ("holds OSNet weights, but the backbone is OSNet-AIN", "osnet_ain_x0_25_imagenet.pth", "DEPTH x0_25")),
    ("ain_x0_25", {}, "x0_25", {"WITH_IBN": True},
     ("holds OSNet-AIN weights, but the backbone is OSNet-IBN", "DEPTH ain_x0_25")),
])
def test_file_of_another_osnet_variant_is_a_one_line_error(tmp_path, file_depth, file_opts, depth, opts, names):
    path = _torchreid_file(_osnet(file_depth, **file_opts), tmp_path / "other.pth", prefix="module.")
    with pytest.raises(WeightsFamilyError) as info:
        _osnet(depth, PRETRAIN=True, PRETRAIN_PATH=path, **opts)
    message = str(info.value)
    assert "\n" not in message and path in message and "MODEL.BACKBONE.PRETRAIN_PATH" in message
    assert all(name in message for name in names), message


def test_file_of_another_width_is_refused(tmp_path):
    path = _torchreid_file(_osnet("x0_5"), tmp_path / "osnet_x0_5_imagenet.pth")
    with pytest.raises(WeightsFamilyError, match="of this OSNet backbone .*same MODEL.BACKBONE.DEPTH") as info:
        _osnet("x0_25", PRETRAIN=True, PRETRAIN_PATH=path)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_file_of_another_family_names_both(tmp_path):
    resnet = build_backbone(tiny_cfg("18x"))
    resnet_file = tmp_path / "resnet18.pth"
    torch.save(dict(resnet.state_dict(), **{"fc.weight": torch.zeros(1000, 512), "fc.bias": torch.zeros(1000)}),
               resnet_file)
    with pytest.raises(WeightsFamilyError) as info:
        _osnet(PRETRAIN=True, PRETRAIN_PATH=str(resnet_file))
    message = str(info.value)
    assert "holds ResNet weights, but the backbone is OSNet" in message and "\n" not in message
    osnet_file = _torchreid_file(_osnet(), tmp_path / "osnet.pth")
    with pytest.raises(WeightsFamilyError, match="holds OSNet weights, but the backbone is ResNet"):
        build_backbone(tiny_cfg("18x", **{"BACKBONE.PRETRAIN": True, "BACKBONE.PRETRAIN_PATH": osnet_file}))


# ---- config errors


def test_unknown_depth_names_the_key_and_every_choice():
    message = _one_line_config_error(_cfg("x2_0"), "MODEL.BACKBONE.DEPTH", "x2_0")
    assert all(depth in message for depth in OSNET_DEPTHS)


@pytest.mark.parametrize("opts, parts", [
    ({"WITH_NL": True}, ("MODEL.BACKBONE.WITH_NL", "WITH_IBN")),
    ({"WITH_SE": True}, ("MODEL.BACKBONE.WITH_SE",)),
    ({"NORM": "LN"}, ("MODEL.BACKBONE.NORM", "GhostBN")),
])
def test_unsupported_options_are_one_line_errors(opts, parts):
    _one_line_config_error(_cfg(**opts), *parts)


def test_ibn_with_ain_is_refused():
    _one_line_config_error(_cfg("ain_x0_5", WITH_IBN=True), "WITH_IBN", "OSNet-AIN", "DEPTH x0_5")
