"""ResNeSt backbones: depths, fast-reid's last-stride rule, split attention, norms, ImageNet
weights in the authors' / timm's layout and the config errors. (Keys, shapes and outputs
against fast-reid itself: test_fastreid_goldens.py.)"""
import pytest
import torch
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.modeling.backbones import RESNEST_DEPTHS, WeightsFamilyError, build_resnest_backbone
from reid_engine.modeling.backbones.imagenet_weights import detect_weights_family
from reid_engine.modeling.backbones.resnest import SplitAttentionConv
from reid_engine.modeling.layers import FrozenBatchNorm2d, GhostBatchNorm
from reid_engine.utils.registry import UnknownChoiceError

from ._backbone_family import (
    assert_fully_loaded,
    build,
    family_cfg,
    save_release_file,
    with_running_stats,
)

NAME = "build_resnest_backbone"


def resnest(depth="50x", **opts):
    return build(NAME, depth, **opts)


@pytest.mark.slow
@pytest.mark.parametrize("depth, blocks, stem_width", [
    ("50x", (3, 4, 6, 3), 32), ("101x", (3, 4, 23, 3), 64),
    ("200x", (3, 24, 36, 3), 64), ("269x", (3, 30, 48, 8), 64),
])
def test_every_depth_builds_with_fastreid_blocks_and_stem(depth, blocks, stem_width):
    with torch.device("meta"):  # the layout only: no memory, no weight initialisation (seconds at 200x / 269x)
        model = resnest(depth)
    assert model.out_channels == 2048
    assert tuple(len(getattr(model, f"layer{i}")) for i in range(1, 5)) == blocks
    assert model.conv1[0].out_channels == stem_width and model.bn1.num_features == 2 * stem_width
    assert model.layer1[0].downsample[1].in_channels == 2 * stem_width
    assert RESNEST_DEPTHS[depth] == (blocks, stem_width)


@pytest.mark.slow
@pytest.mark.parametrize("last_stride, size", [(1, (4, 2)), (2, (2, 1))])
def test_last_stride(last_stride, size):
    # 64x32 -> stem 32x16 -> max-pool (padding 1) 16x8 -> layer2 8x4 -> layer3 4x2 -> layer4
    model = resnest(LAST_STRIDE=last_stride).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 32))
    assert out.shape == (1, 2048, *size)
    first, second = model.layer4[0], model.layer4[1]
    # fast-reid: at last stride 1 the first block keeps a stride-1 average pool and the
    # others are dilated by 2; at 2 the pool takes the stride and nothing is dilated.
    assert first.avd_layer.stride == last_stride and first.conv2.conv.stride == (1, 1)
    assert second.conv2.conv.dilation == ((2, 2) if last_stride == 1 else (1, 1))
    assert isinstance(model.layer4[0].downsample[0], nn.AvgPool2d) == (last_stride == 2)


def test_stride_sits_in_the_avd_pool_and_the_avg_down_shortcut():
    model = resnest()
    block = model.layer2[0]
    assert block.conv2.conv.stride == (1, 1)
    assert (block.avd_layer.kernel_size, block.avd_layer.stride, block.avd_layer.padding) == (3, 2, 1)
    pool = block.downsample[0]
    assert (pool.kernel_size, pool.stride, pool.ceil_mode, pool.count_include_pad) == (2, 2, True, False)
    assert isinstance(model.layer1[0].avd_layer, nn.Identity)  # layer1 has no avd pool
    assert isinstance(model.layer2[1].avd_layer, nn.Identity)  # nor do later blocks
    assert [name for name, _ in block.downsample.named_parameters()] == ["1.weight", "2.weight", "2.bias"]


def test_split_attention_widths_and_weighting():
    layer = SplitAttentionConv(64, "BN", radix=2).eval()
    assert layer.conv.weight.shape == (128, 32, 3, 3) and layer.conv.groups == 2
    assert layer.fc1.weight.shape == (32, 64, 1, 1)  # max(64 * 2 // 4, 32)
    assert SplitAttentionConv(512, "BN").fc1.out_channels == 256
    # all-zero attention logits weigh the two splits equally: the output is their mean
    nn.init.zeros_(layer.fc2.weight)
    nn.init.zeros_(layer.fc2.bias)
    x = torch.randn(2, 64, 6, 4)
    with torch.no_grad():
        splits = torch.relu(layer.bn0(layer.conv(x))).view(2, 2, 64, 6, 4)
        torch.testing.assert_close(layer(x), splits.mean(1))


@pytest.mark.slow
@pytest.mark.parametrize("norm, kind", [("GN", nn.GroupNorm), ("FrozenBN", FrozenBatchNorm2d),
                                        ("syncBN", nn.BatchNorm2d), ("GhostBN", GhostBatchNorm)])
def test_norm_variants_reach_every_norm_layer(norm, kind):
    model = resnest(NORM=norm)
    block = model.layer3[1]
    for layer in (model.conv1[1], model.bn1, block.bn1, block.conv2.bn0, block.conv2.bn1, block.bn3,
                  model.layer3[0].downsample[2]):
        assert isinstance(layer, kind)
    model.train()
    out = model(torch.randn(8, 3, 32, 16))  # 8: GhostBN's 4 ghost batches of 2
    assert out.shape == (8, 2048, 2, 1) and torch.isfinite(out).all()


# ------------------------------------------------------------------------------ ImageNet weights
@pytest.fixture(scope="module")
def release_file(tmp_path_factory):
    """A ResNeSt-50 (seed 1, with running statistics) and its release file, built once for the module."""
    source = with_running_stats(resnest(seed=1))
    return source, save_release_file(source, tmp_path_factory.mktemp("resnest") / "resnest50-528c19ca.pth")


@pytest.mark.slow
def test_release_layout_loads_every_tensor(release_file, load_logs):
    """The authors' resnest50-*.pth and timm's resnest50d use our names plus `fc`."""
    source, path = release_file
    assert detect_weights_family(torch.load(path, weights_only=True)) == "ResNeSt"
    loaded = resnest(seed=2, PRETRAIN=True, PRETRAIN_PATH=path)
    assert_fully_loaded(source, loaded, path, load_logs)


@pytest.mark.slow
def test_another_family_file_names_both_families(tmp_path):
    path = save_release_file(build("build_resnet_backbone", "50x"), tmp_path / "resnet50.pth")
    with pytest.raises(WeightsFamilyError) as caught:
        resnest(PRETRAIN=True, PRETRAIN_PATH=path)
    message = str(caught.value)
    assert "holds ResNet weights, but the backbone is ResNeSt" in message and "\n" not in message


@pytest.mark.slow
@pytest.mark.parametrize("name, depth", [
    ("build_resnext_backbone", "50x"),
    ("build_resnet_backbone", "101x"),
    # 217 of ResNet-50's 318 tensors are found in a ResNeSt-50 file: refused by its fingerprint
    ("build_resnet_backbone", "50x"),
])
def test_a_resnest_file_is_refused_by_other_families(release_file, name, depth):
    _, path = release_file
    family = "ResNeXt" if "resnext" in name else "ResNet"
    with pytest.raises(WeightsFamilyError, match=f"holds ResNeSt weights, but the backbone is {family}"):
        build(name, depth, PRETRAIN=True, PRETRAIN_PATH=path)


# ------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize("opts, message", [
    ({"DEPTH": "50"}, "unknown MODEL.BACKBONE.DEPTH '50': choose one of 50x, 101x, 200x, 269x; did you mean 50x"),
    ({"WITH_IBN": True}, "MODEL.BACKBONE.WITH_IBN is True, but build_resnest_backbone has no such variant "
                         r"\(it has WITH_NL\); set WITH_IBN False"),
    ({"WITH_SE": True}, "MODEL.BACKBONE.WITH_SE is True, but build_resnest_backbone"),
    ({"NORM": "LN"}, "unknown MODEL.BACKBONE.NORM 'LN'"),
])
def test_bad_options_are_one_line_config_errors(opts, message):
    cfg = family_cfg(NAME, opts.pop("DEPTH", "50x"), **opts)
    with pytest.raises((ConfigError, UnknownChoiceError), match=message) as caught:
        build_resnest_backbone(cfg)
    assert "\n" not in str(caught.value)


def test_with_nl_is_ignored_like_fastreid(caplog):
    """fast-reid's own AGW_S50 / sbs_S50 files set WITH_NL True (from their base files); its
    ResNeSt ignores it, so ours builds the same model and says so."""
    plain = build_resnest_backbone(family_cfg(NAME, "50x"))
    with caplog.at_level("WARNING"):
        with_nl = build_resnest_backbone(family_cfg(NAME, "50x", WITH_NL=True))
    assert list(with_nl.state_dict()) == list(plain.state_dict())
    assert "WITH_NL has no effect on build_resnest_backbone" in caplog.text
