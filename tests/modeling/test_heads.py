"""EmbeddingHead: neck, test feature, training outputs, keys and errors."""
import pytest
import torch
from torch.nn import functional as F

from reid_engine.config import ConfigError
from reid_engine.modeling import build_heads
from reid_engine.modeling.heads import EmbeddingHead
from reid_engine.modeling.heads.build import HEADS_REGISTRY
from reid_engine.utils.registry import UnknownChoiceError

from ._helpers import tiny_cfg

_FEATURES = torch.randn(4, 8, 3, 2, generator=torch.Generator().manual_seed(0))
_TARGETS = torch.tensor([0, 1, 2, 1])


def _head(**opts):
    cfg = tiny_cfg(**{f"HEADS.{k}": v for k, v in opts.items()})
    cfg.MODEL.BACKBONE.FEAT_DIM = 2048  # not read: the width comes from in_channels
    cfg.MODEL.HEADS.NUM_CLASSES = opts.get("NUM_CLASSES", 3)
    return build_heads(cfg, in_channels=8)


def _bn_eval(head, x):
    bn = head.bottleneck[-1]
    return (x - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias


def _randomise_neck(head):
    with torch.no_grad():
        bn = head.bottleneck[-1]
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)


def test_num_classes_zero_is_a_clear_error():
    with pytest.raises(ConfigError, match="MODEL.HEADS.NUM_CLASSES is 0: it is filled from the "
                                         "training set by the trainer; set it for standalone use"):
        _head(NUM_CLASSES=0)


def test_bn_neck_bias_is_frozen():
    head = _head(WITH_BNNECK=True)
    bn = head.bottleneck[0]
    assert not bn.bias.requires_grad and bn.weight.requires_grad
    assert head.weight.shape == (3, 8) and head.weight.requires_grad


def _head_with_test_feat(test_feat, **opts):
    cfg = tiny_cfg(**{f"HEADS.{k}": v for k, v in opts.items()})
    cfg.MODEL.HEADS.NUM_CLASSES = 3
    cfg.TEST.NECK_FEAT = test_feat
    return build_heads(cfg, in_channels=8)


@pytest.mark.parametrize("neck_feat", ["before", "after"])
def test_eval_returns_the_bn_neck_output_whatever_the_training_feature(neck_feat):
    """fast-reid: MODEL.HEADS.NECK_FEAT only picks the metric-loss feature; tests use the neck output."""
    head = _head(WITH_BNNECK=True, NECK_FEAT=neck_feat).eval()
    _randomise_neck(head)
    torch.testing.assert_close(head(_FEATURES), _bn_eval(head, _FEATURES.mean((2, 3))))
    assert head.feat_dim == 8


def test_training_feature_follows_heads_neck_feat():
    pooled = _FEATURES.mean((2, 3))
    before = _head(WITH_BNNECK=True, NECK_FEAT="before").train()
    after = _head(WITH_BNNECK=True, NECK_FEAT="after").train()
    after.load_state_dict(before.state_dict())
    torch.testing.assert_close(before(_FEATURES, _TARGETS)["features"], pooled)
    neck = (pooled - pooled.mean(0)) / torch.sqrt(pooled.var(0, unbiased=False) + 1e-5)
    torch.testing.assert_close(after(_FEATURES, _TARGETS)["features"], neck)


def test_test_neck_feat_before_returns_the_pooled_feature():
    head = _head_with_test_feat("before", WITH_BNNECK=True, NECK_FEAT="after").eval()
    _randomise_neck(head)
    torch.testing.assert_close(head(_FEATURES), _FEATURES.mean((2, 3)))


def test_test_neck_feat_before_with_embedding_returns_the_embedded_feature():
    head = _head_with_test_feat("before", EMBEDDING_DIM=6, WITH_BNNECK=True).eval()
    _randomise_neck(head)
    conv = head.bottleneck[0].weight[:, :, 0, 0]
    embedded = _FEATURES.mean((2, 3)) @ conv.T
    torch.testing.assert_close(head(_FEATURES), embedded)
    head_after = _head_with_test_feat("after", EMBEDDING_DIM=6, WITH_BNNECK=True).eval()
    head_after.load_state_dict(head.state_dict())
    torch.testing.assert_close(head_after(_FEATURES), _bn_eval(head_after, embedded))


def test_without_bnneck_both_test_features_are_the_pooled_feature():
    for test_feat in ("before", "after"):
        head = _head_with_test_feat(test_feat, WITH_BNNECK=False).eval()
        torch.testing.assert_close(head(_FEATURES), _FEATURES.mean((2, 3)))


def test_bad_test_neck_feat():
    with pytest.raises(UnknownChoiceError, match="unknown TEST.NECK_FEAT 'middle': choose one of"):
        _head_with_test_feat("middle")


def test_training_outputs_with_linear_classifier():
    head = _head(WITH_BNNECK=True, NECK_FEAT="before", SCALE=2.0).train()
    out = head(_FEATURES, _TARGETS)
    assert set(out) == {"cls_outputs", "pred_class_logits", "features"}
    pooled = _FEATURES.mean((2, 3))
    neck = (pooled - pooled.mean(0)) / torch.sqrt(pooled.var(0, unbiased=False) + 1e-5)
    logits = neck @ head.weight.T
    torch.testing.assert_close(out["cls_outputs"], 2.0 * logits)
    torch.testing.assert_close(out["pred_class_logits"], 2.0 * logits)
    torch.testing.assert_close(out["features"], pooled)


def test_training_outputs_with_margin_classifier_use_cosine_logits():
    head = _head(WITH_BNNECK=False, NECK_FEAT="after", CLS_LAYER="CosSoftmax",
                 SCALE=4.0, MARGIN=0.2).train()
    out = head(_FEATURES, _TARGETS)
    pooled = _FEATURES.mean((2, 3))
    cosine = F.normalize(pooled) @ F.normalize(head.weight).T
    onehot = F.one_hot(_TARGETS, 3).float()
    torch.testing.assert_close(out["cls_outputs"], 4.0 * (cosine - 0.2 * onehot))
    torch.testing.assert_close(out["pred_class_logits"], 4.0 * cosine)
    torch.testing.assert_close(out["features"], pooled)


def test_embedding_layer_keys_and_dimension():
    head = _head(EMBEDDING_DIM=6, WITH_BNNECK=True, NECK_FEAT="after")
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert shapes["bottleneck.0.weight"] == (6, 8, 1, 1)
    assert shapes["bottleneck.1.weight"] == (6,) and shapes["weight"] == (3, 6)
    assert head.eval()(_FEATURES).shape == (4, 6) and head.feat_dim == 6


def test_learnable_gem_key_and_plain_head_keys():
    head = _head(POOL_LAYER="GeneralizedMeanPoolingP", WITH_BNNECK=True)
    assert sorted(head.state_dict()) == sorted([
        "weight", "pool_layer.p", "bottleneck.0.weight", "bottleneck.0.bias",
        "bottleneck.0.running_mean", "bottleneck.0.running_var",
        "bottleneck.0.num_batches_tracked"])
    assert sorted(_head().state_dict()) == ["weight"]


def test_feat_dim_mismatch_and_non_global_pooling_are_clear_errors():
    head = _head(WITH_BNNECK=True)
    with pytest.raises(ValueError, match="has 5 channels but the head was built for 8"):
        head(torch.randn(2, 5, 3, 2), _TARGETS[:2])
    with pytest.raises(ValueError, match="POOL_LAYER 'Identity' left a map"):
        _head(POOL_LAYER="Identity").eval()(_FEATURES)
    # Identity is fine for backbones that already pool
    assert _head(POOL_LAYER="Identity").eval()(_FEATURES[:, :, :1, :1]).shape == (4, 8)


def test_training_without_targets_and_bad_neck_feat():
    with pytest.raises(ValueError, match="needs targets"):
        _head().train()(_FEATURES)
    with pytest.raises(UnknownChoiceError, match="unknown MODEL.HEADS.NECK_FEAT 'middle': choose one of before, after"):
        _head(NECK_FEAT="middle")


@pytest.mark.parametrize("key, value, message", [
    ("NECK_FEAT", "afterr", "unknown MODEL.HEADS.NECK_FEAT 'afterr'.*did you mean after[?]"),
    ("POOL_LAYER", "GlobalAvg", "unknown MODEL.HEADS.POOL_LAYER 'GlobalAvg'.*did you mean GlobalAvgPool[?]"),
    ("CLS_LAYER", "Circle", "unknown MODEL.HEADS.CLS_LAYER 'Circle'.*did you mean CircleSoftmax[?]"),
    ("NORM", "bn", "unknown MODEL.HEADS.NORM 'bn'.*did you mean BN[?]"),
    ("NAME", "Embedding", "unknown MODEL.HEADS.NAME 'Embedding'.*did you mean EmbeddingHead[?]"),
])
def test_wrong_head_values_fail_in_check_and_in_build(key, value, message):
    cfg = tiny_cfg(**{f"HEADS.{key}": value, "HEADS.WITH_BNNECK": True})
    with pytest.raises(UnknownChoiceError, match=message):
        HEADS_REGISTRY.check_config(cfg)
    with pytest.raises(UnknownChoiceError, match=message):
        build_heads(cfg, in_channels=8)
    HEADS_REGISTRY.check_config(tiny_cfg())  # the defaults pass


def test_constructor_is_usable_without_config():
    head = EmbeddingHead(in_channels=8, num_classes=3, with_bnneck=True, neck_feat="after")
    assert head.eval()(_FEATURES).shape == (4, 8)
