"""MGN: fast-reid's layout and embeddings, branches and stripes, losses, frozen branches, errors.

Most tests use a ResNet-18 MGN on 96x32 images (its branch maps have 6 rows: stripes of 3
and of 2 rows); the layout and golden tests build the R50-ibn model of
configs/Market1501/mgn_R50-ibn.yml without running it at full size.
"""
import json
import operator
import os

import pytest
import torch
from torch import nn

from reid_engine.config import ConfigError, get_cfg
from reid_engine.engine import hooks
from reid_engine.engine.train_loop import HookBase, SimpleTrainer
from reid_engine.inference.model import checkpoint_num_classes
from reid_engine.modeling import BACKBONE_REGISTRY, META_ARCH_REGISTRY
from reid_engine.modeling.losses.build import CrossEntropyLoss, TripletLoss
from reid_engine.modeling.meta_arch import MGN, count_flops
from reid_engine.modeling.meta_arch.build import check_model_config
from reid_engine.modeling.meta_arch.mgn import MGN_HEADS, MGN_TEST_ORDER, MGNLosses, horizontal_stripes
from reid_engine.utils.checkpoint import Checkpointer
from reid_engine.utils.registry import UnknownChoiceError
from tests.conftest import REPO_ROOT

from ._helpers import tiny_cfg
from .fastreid_state import GOLDEN_IMAGE_SIZE, GOLDEN_SEED, golden_images, golden_path, random_fastreid_state, read_reference

MGN_CONFIG = os.path.join(REPO_ROOT, "configs", "Market1501", "mgn_R50-ibn.yml")
HEIGHT, WIDTH = 96, 32
EMBED = 16
LOSS_NAMES = ["loss_cls_b1", "loss_cls_b2", "loss_cls_b21", "loss_cls_b22", "loss_cls_b3", "loss_cls_b31",
              "loss_cls_b32", "loss_cls_b33", "loss_triplet_b1", "loss_triplet_b2", "loss_triplet_b3",
              "loss_triplet_b22", "loss_triplet_b33"]


def mgn_cfg(**overrides):
    """A ResNet-18 MGN with Base-MGN's head and losses (GeM-P, CircleSoftmax, CE + triplet)."""
    options = {"META_ARCHITECTURE": "MGN", "HEADS.EMBEDDING_DIM": EMBED, "HEADS.WITH_BNNECK": True,
               "HEADS.NECK_FEAT": "after", "HEADS.POOL_LAYER": "GeneralizedMeanPoolingP",
               "HEADS.CLS_LAYER": "CircleSoftmax", "HEADS.SCALE": 64, "HEADS.MARGIN": 0.35,
               "LOSSES.NAME": ("CrossEntropyLoss", "TripletLoss"), "LOSSES.TRI.MARGIN": 0.0,
               "BACKBONE.LAST_STRIDE": 2}
    options.update(overrides)
    cfg = tiny_cfg("18x", **options)
    cfg.INPUT.SIZE_TRAIN, cfg.INPUT.SIZE_TEST = [HEIGHT, WIDTH], [HEIGHT, WIDTH]
    return cfg


def build(cfg):
    """The meta architecture of `cfg`, without build_model's FLOP count."""
    return META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE).from_config(cfg)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build(mgn_cfg())


def _batch(index=0, n=8, height=HEIGHT):
    g = torch.Generator().manual_seed(index)
    return {"images": torch.randint(0, 256, (n, 3, height, WIDTH), generator=g, dtype=torch.uint8),
            "targets": torch.arange(n) // 2}


def _shapes(module):
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


@pytest.mark.slow
def test_r50_ibn_layout_is_fastreids_and_gives_its_embeddings(tmp_path):
    cfg = get_cfg()
    cfg.merge_from_file(MGN_CONFIG)
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = 751
    r50_ibn = build(cfg)
    assert isinstance(r50_ibn, MGN) and _shapes(r50_ibn) == read_reference("mgn_R50-ibn")
    path = tmp_path / "model_final.pth"
    torch.save({"model": random_fastreid_state(read_reference("mgn_R50-ibn"), GOLDEN_SEED)}, path)
    Checkpointer(r50_ibn).load(str(path), checkpointables=[])
    with open(golden_path("mgn_R50-ibn")) as handle:
        golden = torch.tensor(json.load(handle)["embeddings"])
    with torch.no_grad():
        embeddings = r50_ibn.eval()({"images": golden_images(*GOLDEN_IMAGE_SIZE)})
    assert embeddings.shape == (golden.shape[0], 8 * 256)
    assert (embeddings - golden).abs().max() <= 1e-4 * max(1.0, golden.abs().max().item())


def test_branches_are_copies_of_the_backbone_stages_with_their_strides(model):
    def strides(stage):
        return {tuple(m.stride) for m in stage.modules() if isinstance(m, nn.Conv2d)}

    assert strides(model.b1[1]) == {(1, 1), (2, 2)}  # LAST_STRIDE 2
    assert strides(model.b2[1]) == strides(model.b3[1]) == {(1, 1)}
    for index in (0, 1):  # same initial weights in each branch, but separate parameters
        states = [getattr(model, b)[index].state_dict() for b in ("b1", "b2", "b3")]
        assert all(torch.equal(states[0][k], other[k]) for other in states[1:] for k in states[0])
    assert model.b1[1][0].conv1.weight is not model.b2[1][0].conv1.weight
    # trunk: conv1, bn1, relu, maxpool, layer1, layer2, layer3's first block; ResNet-18's
    # layer3 has 2 blocks, so each branch starts with 1
    assert len(model.backbone) == 7 and len(model.b1[0]) == len(model.b3[0]) == 1


def test_stripes_are_torch_chunks_top_to_bottom():
    rows = torch.arange(16.0).view(1, 1, 16, 1)
    assert [s.flatten().tolist() for s in horizontal_stripes(rows, 3)] == [
        list(range(0, 6)), list(range(6, 12)), list(range(12, 16))]  # fast-reid's 6, 6, 4
    assert [s.shape[2] for s in horizontal_stripes(rows, 2)] == [8, 8]
    with pytest.raises(ConfigError, match="cannot cut a feature map of 4 rows into 3 stripes.*INPUT.SIZE_TRAIN"):
        horizontal_stripes(rows[:, :, :4], 3)


@pytest.mark.parametrize("height", [16, 7])
def test_stripes_match_torch_chunk_and_stay_static_under_dynamic_shapes(height):
    x = torch.rand(2, 3, height, 5)
    assert all(torch.equal(a, b) for a, b in zip(horizontal_stripes(x, 3), torch.chunk(x, 3, dim=2), strict=True))
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    stripe_sums = torch.compile(lambda t: [s.sum(dim=(2, 3)) for s in horizontal_stripes(t, 3)], backend=capture,
                                dynamic=True)
    stripe_sums(x)
    stripe_sums(torch.rand(4, 3, height, 7))  # other batch and width: same graph
    rows = [n.meta["example_value"].shape[2] for n in graphs[0].graph.nodes
            if n.op == "call_function" and n.target is operator.getitem and isinstance(n.meta.get("example_value"), torch.Tensor)]
    assert len(graphs) == 1 and len(rows) == 3 and all(type(r) is int for r in rows), rows  # constants, not symbols


def test_eval_feature_concatenates_the_eight_heads_in_fastreids_order(model):
    model.eval()
    try:
        images = _batch()["images"]
        with torch.no_grad():
            features = model(images)
            normalised = (images.float() - model.pixel_mean) / model.pixel_std
            shared = model.backbone(normalised)
            maps = {b: getattr(model, b)(shared) for b in ("b1", "b2", "b3")}
            rows = {"b2": [(0, 3), (3, 6)], "b3": [(0, 2), (2, 4), (4, 6)]}
            expected = {}
            for head, (branch, stripe) in MGN_HEADS.items():
                fmap = maps[branch]
                if stripe is not None:
                    top, bottom = rows[branch][stripe]
                    fmap = fmap[:, :, top:bottom]
                expected[head] = getattr(model, head)(fmap)
    finally:
        model.train()
    assert maps["b2"].shape[2] == 6 and maps["b1"].shape[2] == 3  # stride 1 vs LAST_STRIDE 2
    assert features.shape == (8, 8 * EMBED)
    assert MGN_TEST_ORDER == ("b1_head", "b2_head", "b3_head", "b21_head", "b22_head", "b31_head", "b32_head",
                              "b33_head")
    torch.testing.assert_close(features, torch.cat([expected[h] for h in MGN_TEST_ORDER], dim=1))


@pytest.mark.slow
def test_training_returns_fastreids_named_losses(model):
    losses = model(_batch())
    assert list(losses) == LOSS_NAMES
    assert all(v.dim() == 0 and torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert all(getattr(model, head).weight.grad.abs().sum() > 0 for head in MGN_HEADS)
    assert model.backbone[0].weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_loss_weights_and_feature_sets_are_fastreids():
    g = torch.Generator().manual_seed(0)
    targets = torch.tensor([0, 0, 1, 1])
    outputs = {head: {"cls_outputs": torch.randn(4, 3, generator=g), "features": torch.randn(4, 5, generator=g)}
               for head in MGN_HEADS}
    ce, tri = CrossEntropyLoss(0.1, 0.2, 2.0), TripletLoss(0.3, False, True, 1.5)
    terms = MGNLosses([ce, tri])(outputs, targets)
    assert list(terms) == LOSS_NAMES
    torch.testing.assert_close(terms["loss_cls_b21"], ce(outputs["b21_head"], targets)["loss_cls"] / 8)
    stripes = torch.cat([outputs[h]["features"] for h in ("b31_head", "b32_head", "b33_head")], dim=1)
    torch.testing.assert_close(terms["loss_triplet_b33"], tri({"features": stripes}, targets)["loss_triplet"] / 5)
    torch.testing.assert_close(terms["loss_triplet_b2"], tri(outputs["b2_head"], targets)["loss_triplet"] / 5)
    assert list(MGNLosses([tri])(outputs, targets)) == LOSS_NAMES[8:]


@pytest.mark.slow
def test_training_with_base_mgn_freeze_layers_keeps_trunk_and_branches_fixed_first():
    """A few SGD steps (the trainer raises on a non-finite loss) with Base-MGN's FREEZE_LAYERS
    frozen for 2 iterations: trunk and branches stay, the heads train, then all train."""
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO_ROOT, "configs", "Base-MGN.yml"))
    assert list(cfg.MODEL.FREEZE_LAYERS) == ["backbone", "b1", "b2", "b3"]
    torch.manual_seed(1)
    model = build(mgn_cfg())
    params = dict(model.named_parameters())
    frozen = {n for n in params if n.split(".")[0] in ("backbone", "b1", "b2", "b3")}
    assert not any(n.startswith("b1_head") for n in frozen) and len(frozen) < len(params)
    # one watched tensor per module MGN freezes or trains (cloning all 30M values is slow)
    watched = {"backbone.0.weight": True, "b1.1.0.conv2.weight": True, "b2.0.0.conv1.weight": True,
               "b3.1.1.bn2.weight": True, "b1_head.weight": False, "b33_head.bottleneck.0.weight": False}
    assert {n for n, is_frozen in watched.items() if is_frozen} <= frozen
    trainer = SimpleTrainer(model, (_batch(i, n=4) for i in range(10**6)),
                            torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    moved_per_step = []
    before = {}

    class Watch(HookBase):
        def before_step(self):
            before.update({n: params[n].detach().clone() for n in watched})

        def after_step(self):
            moved = {n for n in watched if not torch.equal(params[n], before[n])}
            moved_per_step.append(({n for n in moved if watched[n]}, {n for n in moved if not watched[n]}))

    trainer.register_hooks([hooks.LayerFreeze(model, cfg.MODEL.FREEZE_LAYERS, 2), Watch()])
    trainer.train(0, 3)
    heads = {n for n, is_frozen in watched.items() if not is_frozen}
    assert moved_per_step == [(set(), heads)] * 2 + [(set(watched) - heads, heads)]
    assert all(torch.isfinite(v) for v in model(_batch(99, n=4)).values())


@pytest.mark.slow
def test_flops_count_the_three_branches(model):
    baseline = build(tiny_cfg("18x", **{"HEADS.EMBEDDING_DIM": EMBED}))
    assert count_flops(model, (HEIGHT, WIDTH)) > 1.5 * count_flops(baseline, (HEIGHT, WIDTH))


def test_non_resnet_backbone_and_non_local_are_one_line_config_errors(monkeypatch):
    monkeypatch.setitem(BACKBONE_REGISTRY._obj_map, "build_toy_backbone", lambda cfg: nn.Conv2d(3, 8, 1))
    cfg = mgn_cfg(**{"BACKBONE.NAME": "build_toy_backbone"})
    for call in (check_model_config, build):
        with pytest.raises(ConfigError) as info:
            call(cfg)
        message = str(info.value)
        assert "\n" not in message and "MODEL.BACKBONE.NAME is build_toy_backbone" in message
        assert "build_resnet_backbone" in message
    with pytest.raises(ConfigError, match="MODEL.BACKBONE.WITH_NL is True, but MGN.*set MODEL.BACKBONE.WITH_NL False"):
        check_model_config(mgn_cfg(**{"BACKBONE.WITH_NL": True}))
    with pytest.raises(UnknownChoiceError, match="did you mean build_resnet_backbone"):
        check_model_config(mgn_cfg(**{"BACKBONE.NAME": "build_resnet"}))
    with pytest.raises(UnknownChoiceError, match="MODEL.HEADS.POOL_LAYER"):
        check_model_config(mgn_cfg(**{"HEADS.POOL_LAYER": "GeM"}))


def test_images_too_small_for_the_stripes_are_a_config_error(model):
    with pytest.raises(ConfigError, match="rows into 3 stripes"):
        model.eval()(_batch(height=64)["images"])  # 4 rows
    model.train()



def test_inference_reads_the_class_count_of_an_mgn_checkpoint(tmp_path):
    torch.save({"module.b1_head.weight": torch.zeros(9, 4)}, tmp_path / "mgn.pth")
    assert checkpoint_num_classes(str(tmp_path / "mgn.pth")) == 9
