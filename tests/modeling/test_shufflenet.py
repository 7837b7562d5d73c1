"""ShuffleNetV2 (0.5x-2.0x) backbone: every DEPTH, LAST_STRIDE (no effect, as in fast-reid),
NORM, Megvii's ImageNet files, torchvision's refused, and the configuration errors. Outputs equal
to fast-reid's are checked in test_fastreid_goldens.py."""

import pytest
import torch
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.modeling.backbones import BACKBONE_REGISTRY, SHUFFLENETV2_DEPTHS, WeightsFamilyError
from reid_engine.modeling.backbones.imagenet_weights import detect_weights_family
from reid_engine.modeling.backbones.shufflenetv2 import ShuffleV2Block
from reid_engine.modeling.layers import FrozenBatchNorm2d, GhostBatchNorm
from reid_engine.utils.registry import UnknownChoiceError

from ._helpers import tiny_cfg

NAME = "build_shufflenetv2_backbone"


pytestmark = pytest.mark.usefixtures("two_torch_threads")


def _cfg(depth, **opts):
    cfg = tiny_cfg(depth)
    cfg.MODEL.BACKBONE.NAME = NAME
    for key, value in opts.items():
        setattr(cfg.MODEL.BACKBONE, key, value)
    return cfg


def _backbone(depth="0.5x", **opts):
    return BACKBONE_REGISTRY.build(NAME, _cfg(depth, **opts))


# ----------------------------------------------------------------------------- architecture
@pytest.mark.parametrize("depth,channels", [("0.5x", 1024), ("1.0x", 1024), ("1.5x", 1024), ("2.0x", 2048)])
def test_every_depth_builds_with_its_out_channels(depth, channels):
    assert set(SHUFFLENETV2_DEPTHS) == {"0.5x", "1.0x", "1.5x", "2.0x"}
    model = _backbone(depth)
    assert model.out_channels == channels == model.conv_last[0].out_channels
    assert len(model.features) == 16


@pytest.mark.parametrize("last_stride", [1, 2])
def test_stride_32_whatever_last_stride_like_fastreid(last_stride):
    model = _backbone("0.5x", LAST_STRIDE=last_stride).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 32))
    assert out.shape == (1, 1024, 2, 1)


def test_first_block_of_a_stage_keeps_the_input_width_on_the_projection():
    block = _backbone("1.0x").features[0]  # 24 -> 116: projection 24, main branch 92 (Megvii's split)
    assert block.branch_proj[2].out_channels == 24 and block.branch_main[5].out_channels == 92


def test_stride_one_block_passes_the_even_channels_unchanged():
    block = ShuffleV2Block(8, 8, 1, "BN").eval()
    x = torch.randn(2, 8, 4, 4)
    with torch.no_grad():
        out = block(x)
    torch.testing.assert_close(out[:, :4], x[:, 0::2], rtol=0, atol=0)
    torch.testing.assert_close(out[:, 4:], block.branch_main(x[:, 1::2]), rtol=0, atol=0)


@pytest.mark.parametrize("norm,kind", [("FrozenBN", FrozenBatchNorm2d), ("GhostBN", GhostBatchNorm),
                                       ("syncBN", nn.BatchNorm2d)])
def test_every_norm_layer_follows_norm(norm, kind):
    model = _backbone("0.5x", NORM=norm).train()
    norms = [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, FrozenBatchNorm2d))]
    assert len(norms) == 2 + 3 * 16 + 2 * 3 and all(isinstance(m, kind) for m in norms)
    out = model(torch.randn(4, 3, 64, 32))
    assert out.shape == (4, 1024, 2, 1) and torch.isfinite(out).all()


def test_gn_on_narrow_layers_is_a_one_line_error():
    with pytest.raises(ConfigError, match="GN needs channels divisible by 32") as caught:
        _backbone("0.5x", NORM="GN")
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- config errors
def test_unknown_depth_is_one_line_error_naming_the_choices():
    with pytest.raises(UnknownChoiceError, match="MODEL.BACKBONE.DEPTH '1x': choose one of 0.5x, 1.0x, 1.5x, 2.0x") as caught:
        _backbone("1x")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("key", ["WITH_IBN", "WITH_NL", "WITH_SE"])
def test_variants_are_one_line_config_errors(key):
    with pytest.raises(ConfigError, match=f"MODEL.BACKBONE.{key} is True, but {NAME} has no such variant") as caught:
        _backbone("0.5x", **{key: True})
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- ImageNet files
def _megvii_file(model):
    """Megvii's ShuffleNet-Series checkpoint: our keys with "module." under "state_dict", plus the
    bias-free classifier."""
    state = {f"module.{k}": v.clone() for k, v in model.state_dict().items()}
    state["module.classifier.0.weight"] = torch.randn(1000, model.out_channels)
    return {"state_dict": state, "epoch": 240}


def _torchvision_file():
    """The keys of torchvision's shufflenet_v2_x0_5 (another block design; shapes as there)."""
    def conv_bn(prefix, conv, norm, out_channels, in_channels, kernel=1, groups=1):
        bn = {f"{prefix}.{norm}.{k}": torch.ones(out_channels) for k in ("weight", "bias", "running_mean", "running_var")}
        return {f"{prefix}.{conv}.weight": torch.randn(out_channels, in_channels // groups, kernel, kernel), **bn}

    state = {**conv_bn("conv1", 0, 1, 24, 3, 3), **conv_bn("conv5", 0, 1, 1024, 192)}
    width = 24
    for stage, (out_channels, blocks) in enumerate(zip((48, 96, 192), (4, 8, 4)), start=2):
        half = out_channels // 2
        for index in range(blocks):
            prefix = f"stage{stage}.{index}"
            if index == 0:
                state.update(conv_bn(f"{prefix}.branch1", 0, 1, width, width, 3, width))
                state.update(conv_bn(f"{prefix}.branch1", 2, 3, half, width))
            state.update(conv_bn(f"{prefix}.branch2", 0, 1, half, width if index == 0 else half))
            state.update(conv_bn(f"{prefix}.branch2", 3, 4, half, half, 3, half))
            state.update(conv_bn(f"{prefix}.branch2", 5, 6, half, half))
        width = out_channels
    state.update({"fc.weight": torch.randn(1000, 1024), "fc.bias": torch.randn(1000)})
    return state


def test_megvii_release_loads_every_tensor(tmp_path, load_logs):
    torch.manual_seed(1)
    source = _backbone("0.5x")
    for module in source.modules():  # non-trivial statistics, so that a skipped tensor would show
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2)
    path = tmp_path / "ShuffleNetV2.0.5x.pth.tar"
    torch.save(_megvii_file(source), path)
    loaded = _backbone("0.5x", PRETRAIN=True, PRETRAIN_PATH=str(path))
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    total = len(source.state_dict())
    assert f"Loaded {total} of {total} model tensors from {path}." in load_logs.text
    assert "Not in the checkpoint" not in load_logs.text
    assert "not used by the model" not in load_logs.text  # classifier.0 is dropped silently


def test_megvii_file_is_recognised_as_shufflenetv2():
    state = _megvii_file(_backbone("0.5x"))["state_dict"]
    assert detect_weights_family({k[len("module."):]: v for k, v in state.items()}) == "ShuffleNetV2"


def test_torchvision_file_is_refused_as_another_design(tmp_path):
    path = tmp_path / "shufflenetv2_x0.5.pth"
    torch.save(_torchvision_file(), path)
    with pytest.raises(WeightsFamilyError, match="holds torchvision's ShuffleNetV2 .*but the backbone is "
                                                 "ShuffleNetV2; point it to a ShuffleNetV2 [(]Megvii") as caught:
        _backbone("0.5x", PRETRAIN=True, PRETRAIN_PATH=str(path))
    assert "\n" not in str(caught.value)


def test_file_of_another_family_is_refused_naming_both(tmp_path):
    path = tmp_path / "resnet18.pth"
    torch.save(BACKBONE_REGISTRY.build("build_resnet_backbone", tiny_cfg("18x")).state_dict(), path)
    with pytest.raises(WeightsFamilyError, match="holds ResNet weights, but the backbone is ShuffleNetV2"):
        _backbone("0.5x", PRETRAIN=True, PRETRAIN_PATH=str(path))
