"""ResNeXt backbones: depths and 32x4d widths, fast-reid's stem pool / IBN-a / non-local
placement, last stride, norms, ImageNet weights (torchvision / timm / IBN-Net layouts) and
the config errors. (Keys, shapes and outputs against fast-reid itself:
test_fastreid_goldens.py.)"""
import pytest
import torch
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.modeling.backbones import RESNEXT_DEPTHS, WeightsFamilyError, build_resnext_backbone
from reid_engine.modeling.backbones.imagenet_weights import detect_weights_family
from reid_engine.modeling.layers import IBN, FrozenBatchNorm2d, NonLocal
from reid_engine.utils.registry import UnknownChoiceError

from ._backbone_family import (
    assert_fully_loaded,
    build,
    family_cfg,
    save_release_file,
    with_running_stats,
)

NAME = "build_resnext_backbone"
_IMAGES = torch.randn(2, 3, 64, 32, generator=torch.Generator().manual_seed(0))


def resnext(depth="50x", **opts):
    return build(NAME, depth, **opts)


@pytest.mark.slow
@pytest.mark.parametrize("depth, blocks", [("50x", (3, 4, 6, 3)), ("101x", (3, 4, 23, 3)), ("152x", (3, 8, 36, 3))])
def test_every_depth_builds_with_32x4d_bottlenecks(depth, blocks):
    model = resnext(depth)
    assert model.out_channels == 2048 and not hasattr(model, "fc")
    assert tuple(len(getattr(model, f"layer{i}")) for i in range(1, 5)) == blocks
    assert RESNEXT_DEPTHS[depth] == blocks
    # 32 groups of 4 channels at planes 64, doubling per stage (fast-reid: every depth)
    for stage, width in zip(range(1, 5), (128, 256, 512, 1024)):
        conv2 = getattr(model, f"layer{stage}")[-1].conv2
        assert conv2.groups == 32 and conv2.weight.shape == (width, width // 32, 3, 3)


def test_stem_pool_is_fastreid_resnext_s():
    pool = resnext().maxpool  # padding 1, floor mode (fast-reid's ResNet: padding 0, ceil mode)
    assert (pool.kernel_size, pool.stride, pool.padding, pool.ceil_mode) == (3, 2, 1, False)


@pytest.mark.parametrize("last_stride, size", [(1, (4, 2)), (2, (2, 1))])
def test_last_stride(last_stride, size):
    # 64x32 -> stem 32x16 -> max-pool 16x8 -> layer2 8x4 -> layer3 4x2 -> layer4
    model = resnext(LAST_STRIDE=last_stride).eval()
    with torch.no_grad():
        assert model(_IMAGES).shape == (2, 2048, *size)
    assert model.layer4[0].conv2.stride == (last_stride, last_stride)


def test_ibn_a_in_every_stage_including_layer4():
    model = resnext(WITH_IBN=True)
    for stage in range(1, 5):
        for block in getattr(model, f"layer{stage}"):
            assert isinstance(block.bn1, IBN) and not isinstance(block.bn2, IBN)
    assert model.layer4[0].bn1.IN.num_features == 512 and isinstance(model.bn1, nn.BatchNorm2d)


@pytest.mark.parametrize("depth", ["50x", "101x"])
def test_non_local_positions_follow_fastreid(depth):
    model = resnext(depth, WITH_NL=True, WITH_IBN=True)
    assert len(model.NL_2) == 2 and len(model.NL_3) == 3  # 101x too (ResNet-101 has 9 in layer3)
    assert not hasattr(model, "NL_1") and not hasattr(model, "NL_4")
    assert isinstance(model.NL_3[0], NonLocal) and model.NL_3[0].g.weight.shape == (1, 1024, 1, 1)
    if depth == "50x":
        calls = []
        for name, module in model.named_modules():
            if name.count(".") == 1 and name.startswith(("layer2", "NL_2")):
                module.register_forward_hook(lambda m, i, o, name=name: calls.append(name))
        with torch.no_grad():
            model.eval()(_IMAGES[:1])
        assert calls == ["layer2.0", "layer2.1", "layer2.2", "NL_2.0", "layer2.3", "NL_2.1"]


@pytest.mark.parametrize("norm, kind", [("GN", nn.GroupNorm), ("FrozenBN", FrozenBatchNorm2d)])
def test_norm_variants_reach_every_norm_layer(norm, kind):
    model = resnext(NORM=norm, WITH_IBN=True)
    block = model.layer2[0]
    for layer in (model.bn1, block.bn1.BN, block.bn2, block.bn3, block.downsample[1]):
        assert isinstance(layer, kind)
    out = model.train()(_IMAGES)
    assert out.shape == (2, 2048, 4, 2) and torch.isfinite(out).all()


# ------------------------------------------------------------------------------ ImageNet weights
@pytest.mark.slow
def test_torchvision_layout_loads_every_tensor(tmp_path, load_logs):
    """torchvision's / timm's resnext50_32x4d: the ResNet names, a grouped conv2, `fc`."""
    source = with_running_stats(resnext(seed=1))
    path = save_release_file(source, tmp_path / "resnext50_32x4d.pth")
    assert detect_weights_family(torch.load(path, weights_only=True)) == "ResNeXt"
    loaded = resnext(seed=2, PRETRAIN=True, PRETRAIN_PATH=path)
    assert_fully_loaded(source, loaded, path, load_logs)


def _ibn_net_layout(state):
    """IBN-Net's resnext*_ibn_a: IBN-a in layer1-3 only; layer4's bn1 is a plain BN."""
    out = {k: v for k, v in state.items() if not (k.startswith("layer4.") and ".bn1." in k)}
    for block in range(3):
        out.update({f"layer4.{block}.bn1.{name}": value.clone()
                    for name, value in nn.BatchNorm2d(1024).state_dict().items()})
    return out


def test_ibn_net_layout_loads_all_but_layer4_ibn_like_fastreid(tmp_path, load_logs):
    """fast-reid's ResNeXt puts IBN-a into layer4 too, where IBN-Net's release has a plain
    BN: those norms stay as initialised (as in fast-reid) and the log lists them."""
    source = with_running_stats(resnext(seed=1, WITH_IBN=True))
    path = save_release_file(source, tmp_path / "resnext101_ibn_a.pth", rename=_ibn_net_layout)
    loaded = resnext(seed=2, WITH_IBN=True, PRETRAIN=True, PRETRAIN_PATH=path)
    for key, value in source.state_dict().items():
        if not (key.startswith("layer4.") and ".bn1." in key):
            assert torch.equal(loaded.state_dict()[key], value), key
    assert not loaded.layer4[2].bn1.BN.running_mean.any()  # as initialised
    text = load_logs.text
    assert "Not in the checkpoint, left as initialized (18):\n  layer4.0.bn1.BN.{bias," in text
    assert "In the checkpoint but not used by the model (15):\n  layer4.0.bn1.{bias," in text


@pytest.mark.slow
@pytest.mark.parametrize("source_name, target_name, found, wanted", [
    ("build_resnet_backbone", NAME, "ResNet", "ResNeXt"),
    (NAME, "build_resnet_backbone", "ResNeXt", "ResNet"),
    (NAME, "build_resnest_backbone", "ResNeXt", "ResNeSt"),
])
def test_another_family_file_names_both_families(tmp_path, source_name, target_name, found, wanted):
    """The fingerprints tell ResNet from ResNeXt by conv2's grouping (same key names)."""
    path = save_release_file(build(source_name, "50x"), tmp_path / "other.pth")
    assert detect_weights_family(torch.load(path, weights_only=True)) == found
    with pytest.raises(WeightsFamilyError) as caught:
        build(target_name, "50x", PRETRAIN=True, PRETRAIN_PATH=path)
    message = str(caught.value)
    assert f"holds {found} weights, but the backbone is {wanted}" in message and "\n" not in message


# ------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize("depth, opts, message", [
    ("50", {}, "unknown MODEL.BACKBONE.DEPTH '50': choose one of 50x, 101x, 152x; did you mean 50x"),
    ("152x", {"WITH_NL": True}, "MODEL.BACKBONE.WITH_NL: ResNeXt non-local blocks are defined for depths "
                                "50x, 101x, not 152x; set WITH_NL False"),
    ("50x", {"WITH_SE": True}, "MODEL.BACKBONE.WITH_SE is True, but build_resnext_backbone has no such "
                               r"variant \(it has WITH_IBN, WITH_NL\)"),
    ("50x", {"LAST_STRIDE": 4}, "MODEL.BACKBONE.LAST_STRIDE must be 1 or 2"),
])
def test_bad_options_are_one_line_config_errors(depth, opts, message):
    with pytest.raises((ConfigError, UnknownChoiceError), match=message) as caught:
        build_resnext_backbone(family_cfg(NAME, depth, **opts))
    assert "\n" not in str(caught.value)
