"""RepVGG backbones: every depth's structure, LAST_STRIDE and NORM, ImageNet files (the authors'
release and timm's names), config errors, and deploy fusion (block, backbone, whole model,
fused checkpoints loading back)."""
import copy
import logging
import re

import pytest
import torch
from torch import nn

from reid_engine.config import ConfigError
from reid_engine.modeling import build_backbone, build_model, fuse_for_deploy
from reid_engine.modeling import deploy as deploy_module
from reid_engine.modeling.backbones import (
    REPVGG_DEPTHS,
    FusionError,
    RepVGG,
    RepVGGBlock,
    WeightsFamilyError,
)
from reid_engine.modeling.backbones import repvgg as repvgg_module
from reid_engine.modeling.backbones.repvgg import RepVGGSpec
from reid_engine.modeling.layers import FrozenBatchNorm2d, GhostBatchNorm
from reid_engine.utils.checkpoint import Checkpointer
from reid_engine.utils.registry import UnknownChoiceError

from ._helpers import tiny_cfg

# (out_channels, blocks in stage1..4, groups of the grouped layers) of every fast-reid depth
EXPECTED = {
    "A0": (1280, (2, 4, 14, 1), 1), "A1": (1280, (2, 4, 14, 1), 1), "A2": (1408, (2, 4, 14, 1), 1),
    "B0": (1280, (4, 6, 16, 1), 1), "B1": (2048, (4, 6, 16, 1), 1), "B1g2": (2048, (4, 6, 16, 1), 2),
    "B1g4": (2048, (4, 6, 16, 1), 4), "B2": (2560, (4, 6, 16, 1), 1), "B2g2": (2560, (4, 6, 16, 1), 2),
    "B2g4": (2560, (4, 6, 16, 1), 4), "B3": (2560, (4, 6, 16, 1), 1), "B3g2": (2560, (4, 6, 16, 1), 2),
    "B3g4": (2560, (4, 6, 16, 1), 4),
}
# A small trunk for the fusion tests: widths 16-128, grouped (2) blocks with identity branches.
TINY_SPEC = RepVGGSpec((2, 2, 2, 1), (0.25, 0.25, 0.25, 0.25), groups=2)
TINY_GN_SPEC = RepVGGSpec((2, 1, 1, 1), (0.5, 0.5, 0.5, 0.5))  # widths 32-256: GroupNorm's 32 groups fit


def _cfg(depth="A0", **opts):
    return tiny_cfg(depth, **{"BACKBONE.NAME": "build_repvgg_backbone",
                              **{f"BACKBONE.{k}": v for k, v in opts.items()}})


def _backbone(depth="A0", **opts):
    return build_backbone(_cfg(depth, **opts))


def _randomize_norms(model, seed=0):
    """Non-trivial norm statistics and affine values, so that a wrong fold shows."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.BatchNorm2d, FrozenBatchNorm2d)):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=gen) * 0.2)
            module.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            module.weight.data.copy_(torch.rand(n, generator=gen) + 0.5)
            module.bias.data.copy_(torch.randn(n, generator=gen) * 0.1)
    return model


def _images(batch=2, height=64, width=32, seed=0):
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- structure
@pytest.mark.slow
@pytest.mark.parametrize("depth", sorted(EXPECTED))
def test_every_depth_builds_with_its_widths_blocks_and_groups(depth):
    channels, blocks, groups = EXPECTED[depth]
    with torch.device("meta"):  # the structure only: no memory, no init cost for B3
        model = _backbone(depth)
    assert isinstance(model.out_channels, int) and model.out_channels == channels
    assert [len(getattr(model, f"stage{s}")) for s in range(1, 5)] == list(blocks)
    layers = [block for s in range(1, 5) for block in getattr(model, f"stage{s}")]
    # fast-reid groups layers 2, 4, ..., 26 (counting stage1..4 blocks from 1), nothing else
    assert [b.groups for b in layers] == [groups if i % 2 == 0 and i <= 26 else 1 for i in range(1, len(layers) + 1)]
    assert model.stage0.rbr_identity is None and model.stage0.in_channels == 3
    for block in layers:
        has_identity = block.in_channels == block.out_channels and block.stride == 1
        assert (block.rbr_identity is not None) == has_identity
    assert layers[-1].out_channels == channels


def test_depth_table_is_fastreids():
    assert sorted(REPVGG_DEPTHS) == sorted(EXPECTED)


@pytest.mark.parametrize("last_stride, size", [(1, (4, 2)), (2, (2, 1))])
def test_last_stride_sets_the_stride_of_stage4(last_stride, size):
    model = _backbone("A0", LAST_STRIDE=last_stride).eval()
    assert model.stage4[0].stride == last_stride
    with torch.no_grad():
        out = model(_images())
    assert tuple(out.shape) == (2, 1280) + size


@pytest.mark.parametrize("norm, kind", [("BN", nn.BatchNorm2d), ("syncBN", nn.BatchNorm2d),
                                        ("FrozenBN", FrozenBatchNorm2d), ("GhostBN", GhostBatchNorm),
                                        ("GN", nn.GroupNorm)])
def test_norm_variants_are_used_in_every_branch(norm, kind):
    depth = "A1" if norm == "GN" else "A0"  # A0's 48 / 96 channels do not divide into 32 groups
    with torch.device("meta"):
        model = _backbone(depth, NORM=norm)
    block = model.stage1[1]
    assert all(isinstance(n, kind) for n in (block.rbr_dense.bn, block.rbr_1x1.bn, block.rbr_identity))
    if norm in ("FrozenBN", "GN"):
        small = RepVGG(TINY_GN_SPEC, norm=norm)
        small.train()(_images(4, 32, 16)).mean().backward()


# ----------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("opts, message", [
    ({"DEPTH": "A3"}, r"unknown MODEL.BACKBONE.DEPTH 'A3': choose one of A0, A1, A2, B0, B1, B1g2"),
    ({"DEPTH": "b1g2"}, r"did you mean B1g2\?"),
    ({"WITH_IBN": True}, r"MODEL.BACKBONE.WITH_IBN is True, but build_repvgg_backbone has no such variant"),
    ({"WITH_NL": True}, r"MODEL.BACKBONE.WITH_NL is True, but build_repvgg_backbone has no such variant"),
    ({"WITH_SE": True}, r"MODEL.BACKBONE.WITH_SE is True"),
    ({"NORM": "GN"}, r"MODEL.BACKBONE.NORM GN needs widths divisible by 32, but RepVGG-A0 has 48; use another NORM or DEPTH"),
    ({"LAST_STRIDE": 4}, r"LAST_STRIDE must be 1 or 2"),
])
def test_bad_options_are_one_line_config_errors(opts, message):
    with pytest.raises((ConfigError, UnknownChoiceError), match=message) as caught:
        _backbone(**opts)
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- ImageNet files
def _authors_release(model):
    """What DingXiaoH/RepVGG's RepVGG-A0-train.pth holds: our keys plus the classifier `linear`."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["linear.weight"] = torch.randn(1000, model.out_channels)
    state["linear.bias"] = torch.randn(1000)
    return state


def _to_timm_name(key):
    """Our key -> timm's repvgg_* name (stem, stages.N-1, conv_kxk / conv_1x1 / identity)."""
    key = re.sub(r"^stage0\.", "stem.", key)
    key = re.sub(r"^stage(\d)\.", lambda m: f"stages.{int(m.group(1)) - 1}.", key)
    for ours, theirs in (("rbr_dense", "conv_kxk"), ("rbr_1x1", "conv_1x1"), ("rbr_identity", "identity"),
                         ("rbr_reparam", "reparam_conv")):
        key = key.replace(f".{ours}.", f".{theirs}.")
    return key


def _timm_release(model):
    state = {_to_timm_name(k): v.clone() for k, v in model.state_dict().items()}
    state["head.fc.weight"] = torch.randn(1000, model.out_channels)
    state["head.fc.bias"] = torch.randn(1000)
    return state


@pytest.fixture(scope="module")
def a0_source():
    torch.manual_seed(1)
    return _randomize_norms(_backbone("A0"))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["authors", "timm", "authors-wrapped"])
def test_release_layouts_load_every_tensor(layout, a0_source, tmp_path, load_logs):
    if layout == "timm":
        payload = _timm_release(a0_source)
        assert "stages.2.13.identity.running_var" in payload and "stem.conv_kxk.conv.weight" in payload
    elif layout == "authors":
        payload = _authors_release(a0_source)
    else:
        payload = {"state_dict": {"module." + k: v for k, v in _authors_release(a0_source).items()}}
    path = tmp_path / "RepVGG-A0-train.pth"
    torch.save(payload, path)
    loaded = _backbone("A0", PRETRAIN=True, PRETRAIN_PATH=str(path))
    for key, value in a0_source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    n = len(a0_source.state_dict())
    assert f"Loaded {n} of {n} model tensors from {path}." in load_logs.text
    assert "Not in the checkpoint" not in load_logs.text and "not used by the model" not in load_logs.text
    assert all(r.levelno < logging.WARNING for r in load_logs.records)


def test_another_familys_file_names_both_families(tmp_path):
    torch.manual_seed(0)
    resnet = build_backbone(tiny_cfg("18x"))
    state = dict(resnet.state_dict(), **{"fc.weight": torch.zeros(1000, 512), "fc.bias": torch.zeros(1000)})
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)
    with pytest.raises(WeightsFamilyError) as caught:
        _backbone("A0", PRETRAIN=True, PRETRAIN_PATH=str(path))
    message = str(caught.value)
    assert f"{path} holds ResNet weights, but the backbone is RepVGG" in message and "\n" not in message


def test_a_deploy_form_release_is_named_as_such(a0_source, tmp_path):
    fused = fuse_for_deploy(_backbone("A0").eval())
    path = tmp_path / "RepVGG-A0-deploy.pth"
    torch.save(fused.state_dict(), path)
    with pytest.raises(WeightsFamilyError, match="holds RepVGG deploy-form .fused. weights, but the backbone "
                                                 "is RepVGG; point it to a RepVGG .training form"):
        _backbone("A0", PRETRAIN=True, PRETRAIN_PATH=str(path))


def test_another_depths_file_is_refused(a0_source, tmp_path):
    path = tmp_path / "RepVGG-A0-train.pth"
    torch.save(_authors_release(a0_source), path)
    with pytest.raises(WeightsFamilyError, match="of this RepVGG backbone .other depth or layout"):
        _backbone("B0", PRETRAIN=True, PRETRAIN_PATH=str(path))


# ----------------------------------------------------------------------------- deploy fusion
@pytest.mark.parametrize("in_channels, out_channels, stride, groups", [
    (3, 8, 2, 1),    # the stem: no identity branch
    (8, 8, 1, 1),    # with identity
    (8, 8, 1, 4),    # grouped, with identity
    (8, 16, 1, 2),   # grouped, widening: no identity
])
def test_block_fusion_gives_the_same_output(in_channels, out_channels, stride, groups):
    torch.manual_seed(0)
    block = _randomize_norms(RepVGGBlock(in_channels, out_channels, stride=stride, groups=groups)).eval()
    x = torch.randn(2, in_channels, 9, 7)
    with torch.no_grad():
        expected = block(x)
        assert block.fuse_for_deploy() is True
        assert block.fuse_for_deploy() is False  # already fused
        out = block(x)
    assert sorted(block.state_dict()) == ["rbr_reparam.bias", "rbr_reparam.weight"]
    assert block.rbr_reparam.weight.shape == (out_channels, in_channels // groups, 3, 3)
    assert (out - expected).abs().max().item() <= 1e-5


@pytest.fixture(scope="module")
def tiny_trunk():
    torch.manual_seed(3)
    return _randomize_norms(RepVGG(TINY_SPEC), seed=3).eval()


def test_trunk_fusion_is_equivalent_and_logs_the_count(tiny_trunk, caplog):
    caplog.set_level(logging.INFO, logger=deploy_module.__name__)
    fused = copy.deepcopy(tiny_trunk)
    assert fuse_for_deploy(fused) is fused
    images = _images(2, 64, 32)
    with torch.no_grad():
        diff = (fused(images) - tiny_trunk(images)).abs().max().item()
    assert diff <= 1e-4
    assert "Fused 8 blocks for deployment (8 RepVGGBlock)" in caplog.text
    assert all(".rbr_reparam." in k for k in fused.state_dict())
    fuse_for_deploy(fused)  # again: nothing left to fuse
    assert "Fused 0 blocks for deployment: RepVGG has no unfused blocks" in caplog.text


def test_a0_backbone_fusion_is_equivalent():
    torch.manual_seed(0)
    model = _randomize_norms(_backbone("A0")).eval()
    images = _images(2, 64, 32)
    with torch.no_grad():
        expected = model(images)
        out = fuse_for_deploy(model)(images)
    assert (out - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())


@pytest.mark.slow
def test_baseline_with_repvgg_gives_the_same_embeddings_fused(caplog):
    caplog.set_level(logging.INFO, logger=deploy_module.__name__)
    torch.manual_seed(0)
    model = _randomize_norms(build_model(_cfg("A0", LAST_STRIDE=2))).eval()
    images = torch.randint(0, 256, (3, 3, 64, 32), generator=torch.Generator().manual_seed(1)).float()
    with torch.no_grad():
        expected = model(images)
        out = fuse_for_deploy(model)(images)
    assert out.shape == (3, 1280)
    assert (out - expected).abs().max().item() <= 1e-4
    assert "Fused 22 blocks for deployment (22 RepVGGBlock)" in caplog.text


def _fused_state(trunk):
    return fuse_for_deploy(copy.deepcopy(trunk)).state_dict()


def test_fused_state_dict_loads_into_fused_and_training_form_builds(tiny_trunk):
    state = _fused_state(tiny_trunk)
    images = _images(2, 64, 32)
    with torch.no_grad():
        expected = tiny_trunk(images)
    fused_built = fuse_for_deploy(RepVGG(TINY_SPEC))
    training_built = RepVGG(TINY_SPEC)
    for target in (fused_built, training_built):
        result = target.load_state_dict(state, strict=True)
        assert not result.missing_keys and not result.unexpected_keys
        with torch.no_grad():
            assert (target.eval()(images) - expected).abs().max().item() <= 1e-4
    assert all(block.is_fused for block in training_built.modules() if isinstance(block, RepVGGBlock))


def test_fastreid_fused_checkpoint_loads_through_the_checkpointer(tmp_path, load_logs):
    """fast-reid's deploy(True) keeps the fused conv as the block's own fused_weight / fused_bias."""
    torch.manual_seed(0)
    source = _randomize_norms(build_model(_cfg("A0"))).eval()
    images = torch.rand(2, 3, 64, 32, generator=torch.Generator().manual_seed(2)) * 255
    with torch.no_grad():
        expected = source(images)
    state = fuse_for_deploy(source).state_dict()
    state = {k.replace("rbr_reparam.weight", "fused_weight").replace("rbr_reparam.bias", "fused_bias"): v
             for k, v in state.items()}
    path = tmp_path / "model_final.pth"
    torch.save({"model": state, "iteration": 10}, path)
    target = build_model(_cfg("A0"))
    load_logs.set_level(logging.INFO, logger=repvgg_module.__name__)
    Checkpointer(target).load(str(path), checkpointables=[])
    n = len(state)
    assert f"Loaded {n} of {n} model tensors from {path}." in load_logs.text
    assert "22 RepVGG blocks load fused (deploy-form) weights" in load_logs.text
    with torch.no_grad():
        assert (target.eval()(images) - expected).abs().max().item() <= 1e-4


def test_fused_weights_of_another_shape_are_reported_not_loaded(tiny_trunk, load_logs, tmp_path):
    state = _fused_state(tiny_trunk)
    state["stage1.0.rbr_reparam.weight"] = torch.zeros(16, 16, 5, 5)
    path = tmp_path / "odd.pth"
    torch.save({"model": state}, path)
    target = RepVGG(TINY_SPEC)
    Checkpointer(target).load(str(path), checkpointables=[])
    assert not target.stage1[0].is_fused and target.stage1[1].is_fused
    assert "In the checkpoint but not used by the model (2):\n  stage1.0.rbr_reparam.{bias, weight}" in load_logs.text
    assert "Not in the checkpoint, left as initialized" in load_logs.text


def test_group_norm_blocks_cannot_be_fused_and_stay_unchanged():
    model = RepVGG(TINY_GN_SPEC, norm="GN")
    with pytest.raises(FusionError, match="normalises with GroupNorm, which has no running statistics") as caught:
        fuse_for_deploy(model)
    assert "\n" not in str(caught.value)
    assert not model.stage0.is_fused and model.stage0.rbr_dense is not None


@pytest.mark.parametrize("fused", [False, True])
def test_blocks_script_in_both_forms(fused):
    block = _randomize_norms(RepVGGBlock(8, 8, groups=2)).eval()
    if fused:
        block.fuse_for_deploy()
    scripted = torch.jit.script(block)
    x = torch.randn(1, 8, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), block(x))
