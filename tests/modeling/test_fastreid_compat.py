"""fast-reid checkpoint compatibility.

The files in fastreid_keys/ list `key shape` of the state dicts fast-reid builds for
four Market1501 configs (HEADS.NUM_CLASSES 751). Our model, built from the config
each file implies, must have exactly those keys and shapes; a checkpoint with that
layout must load strictly, and through MODEL.WEIGHTS' Checkpointer give the embeddings
fast-reid's own forward gives.
"""

import pytest
import torch

from reid_engine.config import get_cfg
from reid_engine.modeling import META_ARCH_REGISTRY
from reid_engine.utils.checkpoint import Checkpointer

from .fastreid_reference import fastreid_resnet50_embeddings
from .fastreid_state import random_fastreid_state, read_reference

# What each fast-reid config sets, read off its key list (IBN -> bn1.IN/BN, non-local
# -> NL_*, learnable GeM -> heads.pool_layer.p) and fast-reid's Market1501 configs.
_BOT = {"BACKBONE.DEPTH": "50x", "BACKBONE.LAST_STRIDE": 1, "BACKBONE.NORM": "BN",
        "BACKBONE.FEAT_DIM": 2048, "HEADS.NUM_CLASSES": 751, "HEADS.WITH_BNNECK": True,
        "HEADS.NECK_FEAT": "before", "HEADS.POOL_LAYER": "GlobalAvgPool",
        "HEADS.CLS_LAYER": "Linear", "HEADS.EMBEDDING_DIM": 0}
FASTREID_CONFIGS = {
    "bagtricks_R50": dict(_BOT),
    "bagtricks_R50-ibn": dict(_BOT, **{"BACKBONE.WITH_IBN": True}),
    "AGW_R50": dict(_BOT, **{"BACKBONE.WITH_NL": True,
                             "HEADS.POOL_LAYER": "GeneralizedMeanPooling"}),
    "sbs_R50-ibn": dict(_BOT, **{"BACKBONE.WITH_IBN": True, "BACKBONE.WITH_NL": True,
                                 "HEADS.POOL_LAYER": "GeneralizedMeanPoolingP",
                                 "HEADS.NECK_FEAT": "after", "HEADS.CLS_LAYER": "CircleSoftmax",
                                 "HEADS.SCALE": 64, "HEADS.MARGIN": 0.35}),
}


def build_without_summary(cfg):
    """The meta architecture of `cfg` without build_model's FLOP count (tested elsewhere)."""
    return META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE).from_config(cfg)


def config_for(name):
    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.INPUT.SIZE_TEST = [32, 16]  # keeps the build-time FLOP count cheap
    for key, value in FASTREID_CONFIGS[name].items():
        section, leaf = key.split(".")
        setattr(getattr(cfg.MODEL, section), leaf, value)
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FASTREID_CONFIGS))
def test_state_dict_layout_equals_fastreid(name):
    reference = read_reference(name)
    model = build_without_summary(config_for(name))
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert set(ours) == set(reference), (sorted(set(ours) - set(reference))[:5],
                                         sorted(set(reference) - set(ours))[:5])
    assert ours == reference


@pytest.mark.parametrize("name", ["bagtricks_R50-ibn", "AGW_R50"])
def test_other_layouts_load_strictly(name):
    state = random_fastreid_state(read_reference(name), seed=5)
    result = build_without_summary(config_for(name)).load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys


_POOL_OF = {name: opts["HEADS.POOL_LAYER"] for name, opts in FASTREID_CONFIGS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FASTREID_CONFIGS))
def test_fastreid_checkpoint_gives_fastreid_embeddings(name, tmp_path):
    """A fast-reid checkpoint loaded through MODEL.WEIGHTS' Checkpointer gives the embeddings that
    fast-reid's own forward gives, computed independently in fastreid_reference.py: stem pooling
    without padding (ceil mode) and the BN-neck output at test time, also for BoT whose
    MODEL.HEADS.NECK_FEAT is "before" (that key only picks the triplet feature in training)."""
    state = random_fastreid_state(read_reference(name), seed=21)
    path = tmp_path / "model_final.pth"
    torch.save({"model": state, "optimizer": {}, "iteration": 1}, path)
    cfg = config_for(name)
    model = build_without_summary(cfg)
    Checkpointer(model).load(str(path), checkpointables=[])
    # 72x40 makes ceil_mode matter in the stem (36x20 -> 18x10, not 17x9 or 19x11)
    images = torch.randint(0, 256, (2, 3, 72, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ours = model.eval()({"images": images})
        expected = fastreid_resnet50_embeddings(state, images, last_stride=1, pool_layer=_POOL_OF[name])
    assert ours.shape == expected.shape == (2, 2048)
    assert expected.abs().max() > 0.1  # a real signal, not a degenerate all-zero feature
    assert (ours - expected).abs().max().item() <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bagtricks_R50", "sbs_R50-ibn"])
def test_training_feature_follows_heads_neck_feat(name):
    """In training, the feature the triplet-type losses see is the pooled feature for NECK_FEAT
    "before" (BoT) and the BN-neck output for "after" (SBS), as in fast-reid."""
    model = build_without_summary(config_for(name)).train()
    captured = {}

    def record(module, inputs, output):
        captured["pooled"] = output[..., 0, 0].detach().clone()

    model.heads.pool_layer.register_forward_hook(record)
    images = torch.randint(0, 256, (4, 3, 32, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    outputs = model.heads(model.backbone(model.preprocess_image({"images": images})), torch.tensor([0, 1, 0, 1]))
    pooled = captured["pooled"]
    if FASTREID_CONFIGS[name]["HEADS.NECK_FEAT"] == "before":
        torch.testing.assert_close(outputs["features"], pooled)
    else:
        bn = model.heads.bottleneck[0]
        mean, var = pooled.mean(0), pooled.var(0, unbiased=False)
        expected = (pooled - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias
        torch.testing.assert_close(outputs["features"], expected, rtol=1e-4, atol=1e-4)
