"""fast-reid checkpoints of every backbone family and of the S50 and MGN models: our model,
built from the config a layout names, has exactly the layout's keys and shapes, and with the
layout filled by seeded random values it gives the outputs fast-reid 1.4 itself gave
(fastreid_golden/*.json, written by fastreid_golden/make_golden.py under fast-reid)."""
import json
import os

import pytest
import torch

from reid_engine.config import get_cfg
from reid_engine.modeling import BACKBONE_REGISTRY, META_ARCH_REGISTRY
from reid_engine.utils.checkpoint import Checkpointer
from tests.conftest import REPO_ROOT

from .fastreid_state import (
    GOLDEN_DIR,
    GOLDEN_IMAGE_SIZE,
    GOLDEN_SEED,
    LEAKED_KEYS,
    backbone_input,
    backbone_options,
    golden_images,
    golden_layout,
    golden_path,
    random_fastreid_state,
    read_reference,
)

BACKBONE_LAYOUTS = sorted("backbones/" + f[len("backbones__"):-5] for f in os.listdir(GOLDEN_DIR)
                          if f.startswith("backbones__") and f.endswith(".json"))
# whole-model layouts -> the config file of ours that must build them
MODEL_LAYOUTS = {"bagtricks_S50": "configs/Market1501/bagtricks_S50.yml",
                 "mgn_R50-ibn": "configs/Market1501/mgn_R50-ibn.yml",
                 "bagtricks_vit": "configs/Market1501/bagtricks_vit.yml"}


def _max_abs_diff_ok(ours, expected):
    """≤ 1e-4 absolute, scaled up for outputs larger than 1."""
    scale = max(1.0, expected.abs().max().item())
    diff = (ours - expected).abs().max().item()
    assert diff <= 1e-4 * scale, f"max abs diff {diff:.3g} (output scale {scale:.3g})"


def _backbone_cfg(name, with_leaked_keys=False):
    backbone, depth, extra, last_stride = backbone_options(name)
    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.NAME = backbone
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.BACKBONE.LAST_STRIDE = last_stride
    cfg.MODEL.BACKBONE.PRETRAIN = False
    for key, value in extra.items():
        setattr(cfg.MODEL.BACKBONE, key, value)
    if with_leaked_keys:
        cfg.MODEL.BACKBONE.WITH_SE = True
    return cfg


def _shapes(module):
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def test_every_backbone_layout_has_a_golden():
    layouts = sorted("backbones/" + f[:-4] for f in os.listdir(os.path.join(GOLDEN_DIR, "..", "fastreid_keys",
                                                                            "backbones")))
    assert layouts == BACKBONE_LAYOUTS and len(layouts) == 14


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKBONE_LAYOUTS)
def test_backbone_layout_and_outputs_equal_fastreid(name):
    cfg = _backbone_cfg(name)
    model = BACKBONE_REGISTRY.build(cfg.MODEL.BACKBONE.NAME, cfg)
    assert _shapes(model) == golden_layout(name)
    with open(golden_path(name)) as handle:
        golden = json.load(handle)
    model.load_state_dict(random_fastreid_state(golden_layout(name), GOLDEN_SEED), strict=True)
    assert model.out_channels == golden["shape"][1]
    images = golden_images(*GOLDEN_IMAGE_SIZE)
    with torch.no_grad():
        out = model.eval()(backbone_input(images))
    assert list(out.shape) == golden["shape"]
    _max_abs_diff_ok(out.mean((2, 3)), torch.tensor(golden["pooled"]))
    _max_abs_diff_ok(out.mean(1), torch.tensor(golden["map"]))


@pytest.mark.parametrize("name", sorted(LEAKED_KEYS))
def test_layout_file_with_leaked_se_keys_builds_with_se(name):
    """The file's own layout (with SE) is what WITH_SE True builds, so such checkpoints load too."""
    cfg = _backbone_cfg(name, with_leaked_keys=True)
    assert _shapes(BACKBONE_REGISTRY.build(cfg.MODEL.BACKBONE.NAME, cfg)) == read_reference(name)


def _model_cfg(config_file):
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO_ROOT, config_file))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = 751
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODEL_LAYOUTS))
def test_model_checkpoint_loads_and_gives_fastreid_embeddings(name, tmp_path):
    cfg = _model_cfg(MODEL_LAYOUTS[name])
    model = META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE).from_config(cfg)
    assert _shapes(model) == read_reference(name)
    path = tmp_path / "model_final.pth"
    torch.save({"model": random_fastreid_state(read_reference(name), GOLDEN_SEED), "iteration": 1}, path)
    Checkpointer(model).load(str(path), checkpointables=[])
    with open(golden_path(name)) as handle:
        golden = json.load(handle)
    with torch.no_grad():  # a layout's golden may have its own image size (fast-reid's ViT needs 256x128)
        embeddings = model.eval()({"images": golden_images(*golden.get("image_size", GOLDEN_IMAGE_SIZE))})
    assert list(embeddings.shape) == golden["shape"]
    _max_abs_diff_ok(embeddings, torch.tensor(golden["embeddings"]))
