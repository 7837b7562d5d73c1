"""ViT backbone: token grids and position resizing, SIE, the fast-reid layout, timm ImageNet
files, the optimizer recipe (no-decay params, layer-wise LR decay), config errors, and a tiny
ViT training a few iterations on the smoke config with camera ids from the batch."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from reid_engine.config import ConfigError, get_cfg
from reid_engine.data import build_reid_train_loader
from reid_engine.modeling import BACKBONE_REGISTRY
from reid_engine.modeling.backbones import WeightsFamilyError
from reid_engine.modeling.backbones.vit import (
    VIT_DEPTHS,
    VisionTransformer,
    ViTSpec,
    build_vit_backbone,
    patch_grid,
    resize_pos_grid,
)
from reid_engine.modeling.heads.build import build_heads
from reid_engine.modeling.losses.build import build_losses
from reid_engine.modeling.meta_arch.baseline import Baseline
from reid_engine.solver import build_optimizer
from reid_engine.solver.optimizer import get_param_groups
from reid_engine.utils.errors import ReidUserError

from .fastreid_state import read_reference
from .test_backbone_zoo import SMOKE_CFG

TINY = ViTSpec(dim=64, depth=2, heads=2)


def tiny(size=(64, 32), stride=(16, 16), **kwargs):
    torch.manual_seed(0)
    return VisionTransformer(TINY, img_size=size, stride=stride, **kwargs)


def vit_cfg(depth="base", **backbone):
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = "build_vit_backbone"
    cfg.MODEL.BACKBONE.DEPTH = depth
    for key, value in backbone.items():
        setattr(cfg.MODEL.BACKBONE, key, value)
    return cfg


@pytest.mark.parametrize("size,stride,grid", [((256, 128), (16, 16), (16, 8)), ((256, 128), (12, 12), (21, 10)),
                                              ((384, 128), (12, 12), (31, 10)), ((80, 48), (16, 16), (5, 3))])
def test_token_grid_matches_fastreid_formula(size, stride, grid):
    assert patch_grid(size, stride) == grid  # (H - 16) // s + 1 per side
    model = tiny(size, stride)
    assert model.pos_embed.shape == (1, 1 + grid[0] * grid[1], 64)
    assert model.patch_embed(torch.zeros(1, 3, *size)).shape[1] == grid[0] * grid[1]


def test_positions_resize_bilinearly_at_another_input_size():
    model = tiny((64, 32)).eval()  # grid 4x2
    pos = model.positions((6, 3))
    assert pos.shape == (1, 1 + 18, 64)
    assert torch.equal(pos[:, 0], model.pos_embed[:, 0])  # the class position is kept
    grid = model.pos_embed[0, 1:].reshape(4, 2, 64).permute(2, 0, 1)[None]
    expected = F.interpolate(grid, size=(6, 3), mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
    torch.testing.assert_close(pos[0, 1:], expected.reshape(18, 64))
    # one hand-computed value: row 0 of 6 samples old row (0 + 0.5) * 4 / 6 - 0.5 < 0 -> row 0;
    # column 1 of 3 samples old column (1.5 * 2 / 3) - 0.5 = 0.5 -> the mean of columns 0 and 1
    torch.testing.assert_close(pos[0, 1 + 1], (model.pos_embed[0, 1] + model.pos_embed[0, 2]) / 2)
    with torch.no_grad():
        assert model(torch.randn(2, 3, 96, 48)).shape == (2, 64, 1, 1)


def test_resize_pos_grid_is_identity_on_the_same_grid():
    grid_pos = torch.randn(1, 8, 4)
    assert resize_pos_grid(grid_pos, (4, 2), (4, 2)) is grid_pos


def test_sie_changes_output_only_with_the_camera():
    model = tiny(num_cameras=3, sie_coe=3.0).eval()
    assert model.sie_embed.shape == (3, 1, 64)
    image = torch.randn(1, 3, 64, 32).expand(3, -1, -1, -1)
    with torch.no_grad():
        out = model(image, camids=torch.tensor([0, 0, 2]))[..., 0, 0]
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0)
    assert (out[0] - out[2]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="camids"):
        model(image)


def test_baseline_passes_batch_camids_to_the_backbone():
    cfg = get_cfg()
    cfg.MODEL.HEADS.NUM_CLASSES = 4
    cfg.MODEL.HEADS.POOL_LAYER = "Identity"
    cfg.MODEL.HEADS.WITH_BNNECK = True
    model = Baseline(backbone=tiny(num_cameras=2, sie_coe=3.0), heads=build_heads(cfg, 64),
                     pixel_mean=[0.0] * 3, pixel_std=[1.0] * 3).eval()
    images = torch.rand(1, 3, 64, 32).expand(2, -1, -1, -1) * 255
    with torch.no_grad():
        same = model({"images": images, "camids": torch.tensor([1, 1])})
        other = model({"images": images, "camids": torch.tensor([0, 1])})
    torch.testing.assert_close(same[0], same[1])
    assert not torch.allclose(other[0], other[1])


def test_sie_built_only_with_coefficient_and_cameras():
    cfg = vit_cfg("small", SIE_COE=3.0, NUM_CAMERAS=6)
    cfg.INPUT.SIZE_TRAIN = [32, 16]
    assert BACKBONE_REGISTRY.build("build_vit_backbone", cfg).sie_embed.shape == (6, 1, 768)
    cfg.MODEL.BACKBONE.SIE_COE = 0.0
    assert BACKBONE_REGISTRY.build("build_vit_backbone", cfg).sie_embed is None
    cfg.MODEL.BACKBONE.SIE_COE, cfg.MODEL.BACKBONE.NUM_CAMERAS = 3.0, -1
    with pytest.raises(ConfigError, match="NUM_CAMERAS"):
        build_vit_backbone(cfg)


def test_base_layout_equals_fastreid_file():
    cfg = vit_cfg("base")
    model = BACKBONE_REGISTRY.build("build_vit_backbone", cfg)
    expected = {k[len("backbone."):]: v for k, v in read_reference("bagtricks_vit").items()
                if k.startswith("backbone.")}
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    assert model.out_channels == 768


# "large" (ViT-L/16, 1024 wide, 24 blocks) is left out: initialising its 300M weights takes seconds
@pytest.mark.slow
@pytest.mark.parametrize("depth,width,blocks", [("small", 768, 8), ("base", 768, 12)])
def test_every_depth_builds(depth, width, blocks):
    cfg = vit_cfg(depth)
    cfg.INPUT.SIZE_TRAIN = [32, 16]
    model = BACKBONE_REGISTRY.build("build_vit_backbone", cfg)
    assert (model.out_channels, len(model.blocks)) == (width, blocks) == (VIT_DEPTHS[depth].dim, VIT_DEPTHS[depth].depth)


def _timm_file(model, tmp_path, grid_side):
    """A timm-layout file: our keys (timm's names), a square 224-style grid and the classifier."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["pos_embed"] = torch.randn(1, 1 + grid_side * grid_side, model.out_channels)
    state["head.weight"] = torch.randn(1000, model.out_channels)
    state["head.bias"] = torch.zeros(1000)
    path = tmp_path / "vit.pth"
    torch.save(state, path)
    return path, state


@pytest.mark.slow
def test_timm_file_loads_with_position_resize(tmp_path, monkeypatch):
    cfg = vit_cfg("small", STRIDE_SIZE=(12, 12))
    cfg.INPUT.SIZE_TRAIN = [64, 40]  # grid 5x3
    source = BACKBONE_REGISTRY.build("build_vit_backbone", cfg)
    path, state = _timm_file(source, tmp_path, grid_side=4)
    cfg.MODEL.BACKBONE.PRETRAIN, cfg.MODEL.BACKBONE.PRETRAIN_PATH = True, str(path)
    model = BACKBONE_REGISTRY.build("build_vit_backbone", cfg)
    assert torch.equal(model.blocks[3].mlp.fc1.weight, state["blocks.3.mlp.fc1.weight"])
    assert torch.equal(model.cls_token, state["cls_token"])
    expected = resize_pos_grid(state["pos_embed"][:, 1:], (4, 4), (5, 3))
    torch.testing.assert_close(model.pos_embed[:, 1:], expected)
    torch.testing.assert_close(model.pos_embed[:, :1], state["pos_embed"][:, :1])


def _jax_npz(model, path, prefix=""):
    """The model's weights as a JAX ViT release stores them (.npz, kernels (in, out), attention
    split per head), written without going through the code under test."""
    state, heads = model.state_dict(), model.blocks[0].attn.heads
    dim = model.out_channels
    arrays = {
        "embedding/kernel": state["patch_embed.proj.weight"].permute(2, 3, 1, 0),
        "embedding/bias": state["patch_embed.proj.bias"],
        "cls": state["cls_token"],
        "Transformer/posembed_input/pos_embedding": state["pos_embed"],
        "Transformer/encoder_norm/scale": state["norm.weight"],
        "Transformer/encoder_norm/bias": state["norm.bias"],
        "head/kernel": torch.randn(dim, 10), "head/bias": torch.zeros(10),
    }
    for i in range(len(model.blocks)):
        src, dst = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        attn = dst + "MultiHeadDotProductAttention_1/"
        qkv_w, qkv_b = state[src + "attn.qkv.weight"].chunk(3), state[src + "attn.qkv.bias"].chunk(3)
        for part, w, b in zip(("query", "key", "value"), qkv_w, qkv_b):
            arrays[attn + part + "/kernel"] = w.t().reshape(dim, heads, dim // heads)
            arrays[attn + part + "/bias"] = b.reshape(heads, dim // heads)
        arrays[attn + "out/kernel"] = state[src + "attn.proj.weight"].t().reshape(heads, dim // heads, dim)
        arrays[attn + "out/bias"] = state[src + "attn.proj.bias"]
        for ln, norm in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            arrays[dst + ln + "/scale"] = state[src + norm + ".weight"]
            arrays[dst + ln + "/bias"] = state[src + norm + ".bias"]
        for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
            arrays[dst + f"MlpBlock_3/{dense}/kernel"] = state[src + f"mlp.{fc}.weight"].t()
            arrays[dst + f"MlpBlock_3/{dense}/bias"] = state[src + f"mlp.{fc}.bias"]
    np.savez(path, **{prefix + k: v.detach().numpy() for k, v in arrays.items()})


@pytest.mark.parametrize("prefix", ["", "opt/target/"])
def test_jax_npz_release_loads_and_gives_the_same_features(tmp_path, prefix):
    from reid_engine.modeling.backbones.imagenet_weights import load_imagenet_weights

    source = tiny()
    path = tmp_path / "ViT-tiny.npz"
    _jax_npz(source, path, prefix)
    torch.manual_seed(1)
    model = VisionTransformer(TINY, img_size=(64, 32))
    incompatible = load_imagenet_weights(model, str(path), "ViT")
    assert not incompatible.missing_keys and not incompatible.incorrect_shapes
    x = torch.randn(2, 3, 64, 32)
    torch.testing.assert_close(model.eval()(x), source.eval()(x), rtol=0, atol=1e-5)


def test_npz_with_python_objects_is_refused(tmp_path):
    from reid_engine.utils.safe_load import CheckpointError, load_checkpoint_file

    path = tmp_path / "bad.npz"
    np.savez(path, cls=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="bad.npz.*npz"):
        load_checkpoint_file(str(path))


def test_other_family_file_is_refused(tmp_path):
    from reid_engine.modeling.backbones.resnet import build_resnet_backbone

    other = get_cfg()
    other.MODEL.BACKBONE.DEPTH = "18x"
    path = tmp_path / "r18.pth"
    torch.save(build_resnet_backbone(other).state_dict(), path)
    cfg = vit_cfg("small", PRETRAIN=True, PRETRAIN_PATH=str(path))
    cfg.INPUT.SIZE_TRAIN = [32, 16]
    with pytest.raises(WeightsFamilyError, match="ResNet.*ViT"):
        build_vit_backbone(cfg)


def test_optimizer_groups_skip_decay_and_apply_layer_decay():
    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = tiny()
            self.heads = torch.nn.Linear(64, 4)

    model = Wrapper()
    groups = get_param_groups(model, base_lr=1.0, weight_decay=0.1, weight_decay_norm=0.1, bias_lr_factor=1.0,
                              weight_decay_bias=0.1, heads_lr_factor=1.0, layer_decay=0.5)
    setting = {name: (g["lr"], g["weight_decay"]) for g in groups for name, _ in g["params"]}
    for name in ("backbone.pos_embed", "backbone.cls_token", "backbone.norm.weight", "backbone.blocks.1.norm1.bias",
                 "backbone.blocks.0.attn.qkv.bias"):
        assert setting[name][1] == 0.0, name
    assert setting["backbone.blocks.0.attn.qkv.weight"][1] == 0.1
    assert setting["heads.bias"][1] == 0.1  # only the backbone declares no-decay names
    # 4 layers (embeddings, 2 blocks, final norm): layer i gets 0.5 ** (4 - i); the head 1
    assert setting["backbone.patch_embed.proj.weight"][0] == 0.5 ** 4
    assert setting["backbone.blocks.0.mlp.fc1.weight"][0] == 0.5 ** 3
    assert setting["backbone.blocks.1.mlp.fc1.weight"][0] == 0.5 ** 2
    assert setting["backbone.norm.weight"][0] == 0.5
    assert setting["heads.weight"][0] == 1.0
    off = get_param_groups(model, 1.0, 0.1, 0.1, 1.0, 0.1, 1.0)
    assert {g["lr"] for g in off} == {1.0}


def test_bad_layer_decay_is_a_config_error():
    cfg = get_cfg()
    cfg.SOLVER.LAYER_DECAY = 1.5
    with pytest.raises(ConfigError, match="SOLVER.LAYER_DECAY"):
        build_optimizer(cfg, torch.nn.Linear(2, 2))


@pytest.mark.parametrize("key,value,match", [
    ("DEPTH", "huge", "MODEL.BACKBONE.DEPTH"), ("WITH_IBN", True, "WITH_IBN"), ("WITH_NL", True, "WITH_NL"),
    ("STRIDE_SIZE", (20, 16), "STRIDE_SIZE"), ("DROP_PATH_RATIO", 1.0, "DROP_PATH_RATIO"),
    ("SIE_COE", -1.0, "SIE_COE")])
def test_bad_options_are_one_line_config_errors(key, value, match):
    cfg = vit_cfg()
    setattr(cfg.MODEL.BACKBONE, key, value)
    with pytest.raises(ReidUserError, match=match) as info:
        build_vit_backbone.check_config(cfg)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_step_with_gradient_scaling(dtype):
    """A training step of a ViT with SIE and a position resize (64x32 weights, 80x48 input) under
    autocast, with a GradScaler for float16 as AMPTrainer does. CUDA where present; else the CPU,
    whose autocast also computes float16 (the same dtype rules, other kernels)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = tiny(num_cameras=2, sie_coe=3.0, drop_path=0.1).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, enabled=dtype is torch.float16)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.autocast(device, dtype=dtype):
        x = F.interpolate(torch.randn(2, 3, 64, 32, device=device), size=(80, 48))
        out = model(x, camids=torch.tensor([0, 1], device=device))
    assert torch.isfinite(out).all()
    scaler.scale(out.float().square().mean()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    scaler.step(optimizer)
    scaler.update()
    if dtype is torch.float16:
        assert scaler.get_scale() == 2.0 ** 16  # no overflow: the step was taken, the scale kept
    moved = [name for name, p in model.named_parameters() if not torch.equal(p, before[name])]
    assert {"patch_embed.proj.weight", "pos_embed", "cls_token", "sie_embed"} <= set(moved)


def test_tiny_vit_trains_on_the_smoke_config(data_root):
    cfg = get_cfg()
    cfg.merge_from_file(SMOKE_CFG)
    cfg.DATASETS.ROOT = data_root
    cfg.MODEL.HEADS.POOL_LAYER = "Identity"
    cfg.SOLVER.IMS_PER_BATCH = 8
    cfg.SOLVER.LAYER_DECAY = 0.75
    loader = build_reid_train_loader(cfg)
    cfg.MODEL.HEADS.NUM_CLASSES = loader.dataset.num_classes
    backbone = tiny(tuple(cfg.INPUT.SIZE_TRAIN), stride=(12, 12), num_cameras=loader.dataset.num_cameras,
                    sie_coe=3.0, drop=0.1, attn_drop=0.1, drop_path=0.1)
    model = Baseline(backbone=backbone, heads=build_heads(cfg, backbone.out_channels),
                     pixel_mean=list(cfg.MODEL.PIXEL_MEAN), pixel_std=list(cfg.MODEL.PIXEL_STD),
                     loss_fn=build_losses(cfg)).train()
    optimizer = build_optimizer(cfg, model)
    before = backbone.sie_embed.detach().clone()
    batches = iter(loader)
    for _ in range(3):
        losses = model(next(batches))
        total = sum(losses.values())
        assert math.isfinite(total.item()), {k: v.item() for k, v in losses.items()}
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
    assert not torch.equal(backbone.sie_embed, before)  # the camera embedding trained
