"""Every registered backbone family, at its smallest depth: build, forward and backward at a
non-square size, `out_channels`, state-dict round trip, and a few training iterations of the
smoke config (tests/e2e/configs/tiny_R18.yml with the backbone swapped) without NaN."""
import io
import os

import pytest
import torch

from reid_engine.config import get_cfg
from reid_engine.data import build_reid_train_loader
from reid_engine.modeling import BACKBONE_REGISTRY, META_ARCH_REGISTRY
from reid_engine.solver import build_optimizer

SMOKE_CFG = os.path.join(os.path.dirname(__file__), "..", "e2e", "configs", "tiny_R18.yml")

# (MODEL.BACKBONE.NAME, DEPTH, other MODEL.BACKBONE keys): the cheapest member of each family
# and each variant a family has.
ZOO = [
    ("build_resnet_backbone", "18x", {}),
    ("build_resnest_backbone", "50x", {}),
    ("build_resnext_backbone", "50x", {"WITH_IBN": True}),
    ("build_osnet_backbone", "x0_25", {}),
    ("build_osnet_backbone", "x0_25", {"WITH_IBN": True}),
    ("build_osnet_backbone", "ain_x0_25", {}),
    ("build_mobilenetv2_backbone", "0.35x", {}),
    ("build_mobilenetv3_backbone", "Small", {}),
    ("build_shufflenetv2_backbone", "0.5x", {}),
    ("build_regnet_backbone", "200x", {}),
    ("build_regnet_backbone", "200y", {}),
    ("build_effnet_backbone", "b0", {}),
    ("build_repvgg_backbone", "A0", {}),
]
IDS = [f"{name[6:-9]}-{depth}" + "".join(f"-{k.lower()}" for k in extra) for name, depth, extra in ZOO]


pytestmark = pytest.mark.usefixtures("two_torch_threads")


def backbone_cfg(name, depth, extra):
    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.NAME = name
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.BACKBONE.PRETRAIN = False
    for key, value in extra.items():
        setattr(cfg.MODEL.BACKBONE, key, value)
    return cfg


def build(name, depth, extra, seed=0):
    torch.manual_seed(seed)
    return BACKBONE_REGISTRY.build(name, backbone_cfg(name, depth, extra))


@pytest.mark.slow
@pytest.mark.parametrize("name,depth,extra", ZOO, ids=IDS)
def test_forward_backward_at_a_non_square_size_and_state_dict_round_trip(name, depth, extra):
    source = build(name, depth, extra, seed=1).train()
    out = source(torch.randn(2, 3, 72, 40))
    assert out.dim() == 4 and out.shape[0] == 2
    assert out.shape[1] == source.out_channels
    out.float().pow(2).mean().backward()
    grads = [p.grad for p in source.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)

    source.eval()
    for module in source.modules():  # non-trivial statistics, so that a dropped buffer shows
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    target = build(name, depth, extra, seed=2).eval()
    result = target.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    images = torch.randn(2, 3, 64, 32)
    with torch.no_grad():
        torch.testing.assert_close(target(images), source(images), rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name,depth,extra", ZOO, ids=IDS)
def test_smoke_config_trains_without_nan(name, depth, extra, data_root):
    cfg = get_cfg()
    cfg.merge_from_file(SMOKE_CFG)
    cfg.DATASETS.ROOT = data_root
    cfg.MODEL.BACKBONE.NAME = name
    cfg.MODEL.BACKBONE.DEPTH = depth
    for key, value in extra.items():
        setattr(cfg.MODEL.BACKBONE, key, value)
    cfg.SOLVER.IMS_PER_BATCH = 8
    loader = build_reid_train_loader(cfg)
    cfg.MODEL.HEADS.NUM_CLASSES = loader.dataset.num_classes
    torch.manual_seed(0)
    model = META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE).from_config(cfg).train()
    optimizer = build_optimizer(cfg, model)
    before = [p.detach().clone() for p in model.parameters()]
    batches = iter(loader)
    for _ in range(3):
        losses = model(next(batches))
        total = sum(losses.values())
        assert torch.isfinite(total), {k: v.item() for k, v in losses.items()}
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))
