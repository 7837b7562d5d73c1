"""TransReID's jigsaw patch module (MODEL.META_ARCHITECTURE TransReID): the shift and shuffle
against hand computation, the global and part features, the test feature, the loss weights,
the solver recipe of the copied block, config errors, and a tiny ViT through DefaultTrainer."""
import logging
import math

import pytest
import torch

from reid_engine.config import ConfigError, get_cfg
from reid_engine.modeling import build_model
from reid_engine.modeling.backbones.vit import VIT_DEPTHS, LastBlockCopy
from reid_engine.modeling.heads.build import build_heads
from reid_engine.modeling.losses.build import build_losses
from reid_engine.modeling.meta_arch import META_ARCH_REGISTRY, TransReID
from reid_engine.modeling.meta_arch.transreid import JPMLosses, jigsaw_rearrange
from reid_engine.solver.optimizer import get_param_groups

from .test_backbone_zoo import SMOKE_CFG
from .test_vit import TINY, tiny


def _tokens(n):
    """(1, n, 1) patch tokens whose value is their index."""
    return torch.arange(n, dtype=torch.float32).view(1, n, 1)


@pytest.mark.parametrize("n,shift,groups,expected", [
    # rolled left by shift - 1 = 4: 4 5 6 7 0 1 2 3; runs (4 5 6 7) (0 1 2 3) interleaved
    (8, 5, 2, [4, 0, 5, 1, 6, 2, 7, 3]),
    # 7 tokens: 4 5 6 0 1 2 3, padded with the second-to-last (2): runs (4 5 6 0) (1 2 3 2)
    (7, 5, 2, [4, 1, 5, 2, 6, 3, 0, 2]),
    (6, 1, 3, [0, 2, 4, 1, 3, 5]),  # no shift; runs (0 1) (2 3) (4 5)
    (5, 1, 1, [0, 1, 2, 3, 4]),  # neither
])
def test_jigsaw_rearrange_matches_hand_computation(n, shift, groups, expected):
    out = jigsaw_rearrange(_tokens(n).expand(2, -1, 3), shift, groups)
    assert out[0, :, 0].tolist() == expected
    assert torch.equal(out[0], out[1]) and torch.equal(out[..., 0], out[..., 2])


def test_jigsaw_rearrange_names_the_key_when_groups_do_not_fit():
    with pytest.raises(ValueError, match="SHUFFLE_GROUPS"):
        jigsaw_rearrange(_tokens(7), 1, 3)


def _cfg(**jpm):
    cfg = get_cfg()
    cfg.MODEL.HEADS.NUM_CLASSES = 5
    cfg.MODEL.HEADS.POOL_LAYER = "Identity"
    cfg.MODEL.LOSSES.NAME = ("CrossEntropyLoss", "TripletLoss")
    for key, value in jpm.items():
        setattr(cfg.MODEL.JPM, key, value)
    return cfg


def _model(rearrange=True, stride=(12, 12), **jpm):
    """A TransReID over the tiny ViT (64x32 input) with SIE over 3 cameras."""
    cfg = _cfg(**jpm)
    vit = tiny(stride=stride, num_cameras=3, sie_coe=3.0)
    heads = [build_heads(cfg, vit.out_channels) for _ in range(1 + cfg.MODEL.JPM.NUM_PARTS)]
    return TransReID(backbone=vit, local_branch=LastBlockCopy(vit), heads=heads, num_parts=cfg.MODEL.JPM.NUM_PARTS,
                     shift=cfg.MODEL.JPM.SHIFT_NUM, groups=cfg.MODEL.JPM.SHUFFLE_GROUPS, rearrange=rearrange,
                     pixel_mean=[0.0] * 3, pixel_std=[255.0] * 3, loss_fn=JPMLosses(build_losses(cfg)))


def _batch(size=4):
    g = torch.Generator().manual_seed(0)
    return {"images": torch.rand(size, 3, 64, 32, generator=g) * 255, "targets": torch.arange(size) % 5,
            "camids": torch.arange(size) % 3}


@pytest.mark.parametrize("rearrange", [False, True])
def test_global_feature_is_the_plain_vit_and_parts_see_their_token_groups(rearrange):
    model = _model(rearrange).eval()
    batch = _batch()
    images, camids = model.preprocess_image(batch), batch["camids"]
    with torch.no_grad():
        inputs = model.head_inputs(batch)
        torch.testing.assert_close(inputs[0], model.backbone(images, camids=camids))
        tokens = model.backbone.forward_tokens(images, camids, skip_last=1)
        patches = tokens[:, 1:]  # a 5x2 grid at stride 12: 10 patches, 4 parts of 2 (the 9th and 10th dropped)
        assert patches.shape[1] == 10
        if rearrange:
            order = jigsaw_rearrange(_tokens(10), 5, 2)[0, :, 0].long()
            patches = patches[:, order]
        assert len(inputs) == 5
        for i, part in enumerate(inputs[1:]):
            group = torch.cat([tokens[:, :1], patches[:, 2 * i:2 * i + 2]], dim=1)
            expected = model.local_branch.norm(model.local_branch.block(group))[:, 0]
            torch.testing.assert_close(part.flatten(1), expected)
        assert not torch.allclose(inputs[1], inputs[2])


def test_local_branch_starts_as_the_last_block_and_test_feature_divides_parts():
    model = _model().eval()
    vit = model.backbone
    copied = model.local_branch.state_dict()
    original = {**{f"block.{k}": v for k, v in vit.blocks[-1].state_dict().items()},
                **{f"norm.{k}": v for k, v in vit.norm.state_dict().items()}}
    assert copied.keys() == original.keys() and all(torch.equal(copied[k], original[k]) for k in copied)
    assert copied["norm.weight"].data_ptr() != original["norm.weight"].data_ptr()  # a copy, not shared
    batch = _batch()
    with torch.no_grad():
        feature = model(batch)
        inputs = model.head_inputs(batch)
        heads = [head(x) for head, x in zip(model.heads, inputs)]
    assert feature.shape == (4, 5 * TINY.dim)
    torch.testing.assert_close(feature, torch.cat([heads[0]] + [h / 4 for h in heads[1:]], dim=1))


def test_losses_are_half_global_and_half_the_mean_over_parts():
    model = _model().train()
    batch = _batch()
    losses = model(batch)
    assert set(losses) == {"loss_cls", "loss_cls_parts", "loss_triplet", "loss_triplet_parts"}
    inputs = model.head_inputs(batch)  # dropout is 0: the same features again
    outputs = [head(x, batch["targets"]) for head, x in zip(model.heads, inputs)]
    per_head = [build_losses(_cfg())(out, batch["targets"]) for out in outputs]
    for name in ("loss_cls", "loss_triplet"):
        assert losses[name].item() == pytest.approx(0.5 * per_head[0][name].item(), rel=1e-5)
        parts = sum(h[name].item() for h in per_head[1:]) / 4
        assert losses[f"{name}_parts"].item() == pytest.approx(0.5 * parts, rel=1e-5)


def test_copied_block_follows_the_vit_solver_recipe():
    model = _model()
    groups = get_param_groups(model, base_lr=1.0, weight_decay=0.1, weight_decay_norm=0.1, bias_lr_factor=1.0,
                              weight_decay_bias=0.1, heads_lr_factor=1.0, layer_decay=0.5)
    setting = {name: (g["lr"], g["weight_decay"]) for g in groups for name, _ in g["params"]}
    depth = TINY.depth  # layers 0..depth+1; lr factor 0.5 ** (depth + 2 - id)
    assert setting["local_branch.norm.weight"] == setting["backbone.norm.weight"] == (0.5, 0.0)
    assert setting["local_branch.block.attn.qkv.weight"] == setting[f"backbone.blocks.{depth - 1}.attn.qkv.weight"]
    assert setting["local_branch.block.attn.qkv.weight"] == (0.25, 0.1)
    assert setting["local_branch.block.mlp.fc1.bias"][1] == 0.0


@pytest.mark.parametrize("key,value,match", [
    ("MODEL.BACKBONE.NAME", "build_resnet_backbone", "copies a ViT's last block"),
    ("MODEL.JPM.NUM_PARTS", 0, "MODEL.JPM.NUM_PARTS must be an int >= 1"),
    ("MODEL.JPM.SHUFFLE_GROUPS", 0, "MODEL.JPM.SHUFFLE_GROUPS"),
    ("MODEL.HEADS.POOL_LAYER", "GlobalAvgPool", "set it to Identity"),
    # 256x128 at stride 16: 128 patch tokens; neither 128 nor 129 is a multiple of 5
    ("MODEL.JPM.SHUFFLE_GROUPS", 5, r"128 patch tokens \(INPUT.SIZE_TRAIN \[256, 128\]\) cannot be shuffled into 5"),
    ("INPUT.SIZE_TEST", [16, 16], r"1 patch tokens \(INPUT.SIZE_TEST \[16, 16\]\) cannot make 4 parts"),
])
def test_config_errors_name_the_key(key, value, match):
    cfg = _cfg()
    cfg.MODEL.META_ARCHITECTURE = "TransReID"
    cfg.MODEL.BACKBONE.NAME = "build_vit_backbone"
    cfg.MODEL.BACKBONE.DEPTH = "small"
    cfg.merge_from_list([key, value])
    with pytest.raises(ConfigError, match=match) as info:
        META_ARCH_REGISTRY.get("TransReID").check_config(cfg)
    assert "\n" not in str(info.value)


def test_tiny_transreid_trains_and_evaluates_through_default_trainer(tmp_path, data_root, monkeypatch):
    """build_model from config (a tiny ViT size registered for the test), overlapping stride,
    the camera count from the training set, a few steps and the evaluation."""
    from reid_engine.engine.defaults import DefaultTrainer

    monkeypatch.setitem(VIT_DEPTHS, "tiny", TINY)
    logging.getLogger("reid_engine").setLevel(logging.INFO)  # else DefaultTrainer sets up logging
    cfg = get_cfg()
    cfg.merge_from_file(SMOKE_CFG)
    cfg.merge_from_list(["MODEL.META_ARCHITECTURE", "TransReID", "MODEL.BACKBONE.NAME", "build_vit_backbone",
                         "MODEL.BACKBONE.DEPTH", "tiny", "MODEL.BACKBONE.STRIDE_SIZE", (12, 12),
                         "MODEL.BACKBONE.NUM_CAMERAS", -1, "MODEL.HEADS.POOL_LAYER", "Identity",
                         "MODEL.JPM.NUM_PARTS", 2, "DATASETS.ROOT", data_root, "OUTPUT_DIR", str(tmp_path),
                         "SOLVER.MAX_EPOCH", 1, "SOLVER.CHECKPOINT_PERIOD", 100, "TEST.EVAL_PERIOD", 1])
    trainer = DefaultTrainer(cfg)
    model = trainer.model
    assert isinstance(model, TransReID) and len(model.heads) == 3
    assert model.backbone.sie_embed.shape[0] == 3  # SyntheticReIDTiny's cameras
    before = {k: v.clone() for k, v in model.local_branch.state_dict().items()}
    trainer.resume_or_load(resume=False)
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in model.local_branch.state_dict().items())
    metrics = next(iter(trainer._last_eval_results.values()))  # the final evaluation of the run
    assert 0.0 <= metrics["mAP"] <= 100.0 and math.isfinite(metrics["Rank-1"])
    model.eval()
    with torch.no_grad():
        assert model(_batch(2) | {"camids": torch.tensor([0, 2])}).shape == (2, 3 * TINY.dim)


def test_build_model_copies_the_block_after_imagenet_weights(monkeypatch, tmp_path):
    """The local branch is copied from the loaded ViT, so it starts from the file's last block."""
    monkeypatch.setitem(VIT_DEPTHS, "tiny", TINY)
    source = tiny()
    for p in source.parameters():
        torch.nn.init.normal_(p.data)
    weights = tmp_path / "vit.pth"
    torch.save(source.state_dict(), weights)
    cfg = _cfg()
    cfg.merge_from_list(["MODEL.META_ARCHITECTURE", "TransReID", "MODEL.BACKBONE.NAME", "build_vit_backbone",
                         "MODEL.BACKBONE.DEPTH", "tiny", "MODEL.BACKBONE.PRETRAIN", True,
                         "MODEL.BACKBONE.PRETRAIN_PATH", str(weights), "MODEL.DEVICE", "cpu",
                         "INPUT.SIZE_TRAIN", [64, 32], "INPUT.SIZE_TEST", [64, 32]])
    model = build_model(cfg)
    last = TINY.depth - 1
    for name, value in model.local_branch.block.state_dict().items():
        assert torch.equal(value, source.state_dict()[f"blocks.{last}.{name}"]), name


def test_flops_are_counted_with_a_camera_embedding():
    """count_flops passes camera ids, so a model whose ViT has SIE is counted; JPM adds the
    local branch's runs over the parts (the whole last block again, on shorter sequences)."""
    from reid_engine.modeling.meta_arch import count_flops

    with_parts = count_flops(_model(), (64, 32))
    plain_vit_part = count_flops(_model(NUM_PARTS=1), (64, 32))
    assert with_parts > plain_vit_part > 0
