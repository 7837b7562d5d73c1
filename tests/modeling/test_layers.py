"""Norms, IBN, SE, non-local, pooling and classifier layers against hand computations."""
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from reid_engine.modeling.layers import (
    CLS_LAYER_REGISTRY,
    IBN,
    POOLING_REGISTRY,
    FrozenBatchNorm2d,
    GhostBatchNorm,
    NonLocal,
    SELayer,
    build_cls_layer,
    build_pooling,
    get_norm,
)
from reid_engine.utils.registry import UnknownChoiceError


# ----------------------------------------------------------------------------- norms
@pytest.mark.parametrize("name, cls", [("BN", nn.BatchNorm2d), ("syncBN", nn.BatchNorm2d),
                                       ("GN", nn.GroupNorm), ("FrozenBN", FrozenBatchNorm2d),
                                       ("GhostBN", GhostBatchNorm)])
def test_get_norm_types(name, cls):
    layer = get_norm(name, 64)
    assert type(layer) is cls
    assert layer(torch.randn(4, 64, 3, 3)).shape == (4, 64, 3, 3)


def test_get_norm_gn_has_32_groups_and_rejects_odd_widths():
    assert get_norm("GN", 64).num_groups == 32
    with pytest.raises(ValueError, match="divisible by 32"):
        get_norm("GN", 48)


def test_get_norm_unknown_name():
    with pytest.raises(UnknownChoiceError, match="unknown MODEL.BACKBONE.NORM 'LN': choose one of BN, syncBN"):
        get_norm("LN", 8)
    with pytest.raises(UnknownChoiceError, match="unknown MODEL.HEADS.NORM 'gn'.*did you mean GN[?]"):
        get_norm("gn", 8, key="MODEL.HEADS.NORM")


def test_get_norm_bias_freeze():
    layer = get_norm("BN", 8, bias_freeze=True)
    assert not layer.bias.requires_grad and layer.weight.requires_grad


def test_frozen_bn_matches_bn_eval_and_shares_its_keys():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(6)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_()
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    frozen = FrozenBatchNorm2d(6)
    frozen.load_state_dict(bn.state_dict(), strict=True)
    x = torch.randn(3, 6, 4, 4)
    torch.testing.assert_close(frozen(x), bn.eval()(x))
    assert list(frozen.state_dict()) == list(bn.state_dict())
    assert list(frozen.parameters()) == []
    frozen.train()
    torch.testing.assert_close(frozen(x), bn(x))  # training mode changes nothing


def test_ghost_bn_normalises_each_ghost_batch_separately():
    torch.manual_seed(0)
    ghost = GhostBatchNorm(3, num_splits=2)
    x = torch.randn(8, 3, 2, 2)
    out = ghost(x)
    # Ghost batch k holds the samples k, k+2, k+4, ... (the fold into channels).
    folded = x.view(4, 2, 3, 2, 2)
    for k in range(2):
        part = folded[:, k]
        expected = (part - part.mean((0, 2, 3), keepdim=True)) / torch.sqrt(
            part.var((0, 2, 3), unbiased=False, keepdim=True) + ghost.eps)
        torch.testing.assert_close(out.view(4, 2, 3, 2, 2)[:, k], expected)
    ghost.eval()
    torch.testing.assert_close(ghost(x), F.batch_norm(x, ghost.running_mean, ghost.running_var,
                                                      ghost.weight, ghost.bias, False, 0.0, ghost.eps))
    with pytest.raises(ValueError, match="multiple of 2"):
        ghost.train()(torch.randn(3, 3, 2, 2))


# ----------------------------------------------------------------------------- blocks
def test_ibn_splits_channels_between_instance_and_batch_norm():
    ibn = IBN(6)
    assert ibn.IN.num_features == 3 and ibn.BN.num_features == 3 and ibn.IN.affine
    assert sorted(k.split(".")[0] for k in ibn.state_dict()) == ["BN"] * 5 + ["IN"] * 2
    x = torch.randn(2, 6, 4, 4) * 3 + 1
    out = ibn(x)
    first = x[:, :3]
    expected_in = (first - first.mean((2, 3), keepdim=True)) / torch.sqrt(
        first.var((2, 3), unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(out[:, :3], expected_in)
    second = x[:, 3:]
    expected_bn = (second - second.mean((0, 2, 3), keepdim=True)) / torch.sqrt(
        second.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(out[:, 3:], expected_bn)


def test_se_layer_gates_channels():
    torch.manual_seed(0)
    se = SELayer(32, reduction=16)
    assert se.fc[0].weight.shape == (2, 32) and se.fc[2].weight.shape == (32, 2)
    x = torch.randn(2, 32, 3, 3)
    squeeze = x.mean((2, 3))
    gate = torch.sigmoid(torch.relu(squeeze @ se.fc[0].weight.T) @ se.fc[2].weight.T)
    torch.testing.assert_close(se(x), x * gate[:, :, None, None])


def test_non_local_default_width_is_fastreids_and_starts_as_identity():
    block = NonLocal(16)
    shapes = {k: tuple(v.shape) for k, v in block.state_dict().items()}
    assert shapes["g.weight"] == (1, 16, 1, 1) and shapes["W.0.weight"] == (16, 1, 1, 1)
    assert shapes["theta.weight"] == (1, 16, 1, 1) and shapes["phi.bias"] == (1,)
    x = torch.randn(2, 16, 3, 2)
    torch.testing.assert_close(block.eval()(x), x)


def test_non_local_matches_hand_computation():
    torch.manual_seed(0)
    block = NonLocal(4, inter_channels=2).eval()
    with torch.no_grad():
        block.W[1].weight.fill_(1.5)
        block.W[1].bias.fill_(0.2)
    x = torch.randn(1, 4, 2, 3)

    def conv1x1(conv, t):  # (C_in, N) -> (C_out, N)
        return conv.weight[:, :, 0, 0] @ t + conv.bias[:, None]

    flat = x[0].reshape(4, 6)
    theta, phi, g = conv1x1(block.theta, flat), conv1x1(block.phi, flat), conv1x1(block.g, flat)
    y = torch.zeros(2, 6)
    for i in range(6):
        for j in range(6):
            y[:, i] += (theta[:, i] @ phi[:, j]) / 6 * g[:, j]
    w_y = conv1x1(block.W[0], y)
    bn = block.W[1]
    w_y = (w_y - bn.running_mean[:, None]) / torch.sqrt(bn.running_var[:, None] + bn.eps) \
        * bn.weight[:, None] + bn.bias[:, None]
    torch.testing.assert_close(block(x), x + w_y.reshape(1, 4, 2, 3))


# ----------------------------------------------------------------------------- pooling
# channel 0 holds 1..4, channel 1 holds -1, 0.5, 2, 0.25
_MAP = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]], [[-1.0, 0.5], [2.0, 0.25]]]])


def test_pooling_registry_lists_every_layer():
    assert sorted(k for k, _ in POOLING_REGISTRY) == sorted([
        "Identity", "Flatten", "GlobalAvgPool", "GlobalMaxPool", "GeneralizedMeanPooling",
        "GeneralizedMeanPoolingP", "AdaptiveAvgMaxPool", "ClipGlobalAvgPool"])
    with pytest.raises(UnknownChoiceError, match="unknown MODEL.HEADS.POOL_LAYER 'Avg': choose one of "
                                                 "AdaptiveAvgMaxPool, ClipGlobalAvgPool"):
        build_pooling("Avg")


@pytest.mark.parametrize("name, expected", [
    ("GlobalAvgPool", [2.5, 0.4375]),
    ("GlobalMaxPool", [4.0, 2.0]),
    ("AdaptiveAvgMaxPool", [6.5, 2.4375]),
    ("ClipGlobalAvgPool", [1.0, 0.4375]),
    # (mean of clamp(x, 1e-6)^3)^(1/3): (1+8+27+64)/4 = 25; (0+0.125+8+0.015625)/4
    ("GeneralizedMeanPooling", [25 ** (1 / 3), (8.140625 / 4) ** (1 / 3)]),
    ("GeneralizedMeanPoolingP", [25 ** (1 / 3), (8.140625 / 4) ** (1 / 3)]),
])
def test_global_pooling_values(name, expected):
    out = build_pooling(name)(_MAP)
    assert out.shape == (1, 2, 1, 1)
    torch.testing.assert_close(out.flatten(), torch.tensor(expected), rtol=1e-5, atol=1e-5)


def test_flatten_and_identity():
    flat = build_pooling("Flatten")(_MAP)
    assert flat.shape == (1, 8, 1, 1)
    assert flat.flatten().tolist() == [1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 2.0, 0.25]
    assert build_pooling("Identity")(_MAP) is _MAP


def test_learnable_gem_exponent_is_a_trained_parameter():
    pool = build_pooling("GeneralizedMeanPoolingP")
    assert [name for name, _ in pool.named_parameters()] == ["p"] and pool.p.shape == (1,)
    pool(_MAP.abs() + 0.1).sum().backward()
    assert pool.p.grad is not None and pool.p.grad.abs().item() > 0
    assert list(build_pooling("GeneralizedMeanPooling").state_dict()) == []


# ----------------------------------------------------------------------------- classifiers
_COS = torch.tensor([[0.5, -0.2, 0.1], [0.3, 0.6, -0.4]])
_TARGETS = torch.tensor([0, -1])  # the second sample's class is not among the centres


def test_cls_layer_registry_and_error():
    assert sorted(k for k, _ in CLS_LAYER_REGISTRY) == [
        "ArcSoftmax", "CircleSoftmax", "CosSoftmax", "Linear"]
    with pytest.raises(UnknownChoiceError, match="unknown MODEL.HEADS.CLS_LAYER 'Softmax': choose one of "
                                                 "ArcSoftmax, CircleSoftmax, CosSoftmax, Linear"):
        build_cls_layer("Softmax", 3, 1.0, 0.0)


def test_linear_scales_logits():
    layer = build_cls_layer("Linear", 3, 2.0, 0.3)
    assert not layer.uses_cosine
    torch.testing.assert_close(layer(_COS.clone(), _TARGETS), 2.0 * _COS)


def test_cos_softmax():
    out = build_cls_layer("CosSoftmax", 3, 2.0, 0.1)(_COS.clone(), _TARGETS)
    expected = torch.tensor([[2 * 0.4, 2 * -0.2, 2 * 0.1], [0.6, 1.2, -0.8]])
    torch.testing.assert_close(out, expected)


def test_arc_softmax():
    out = build_cls_layer("ArcSoftmax", 3, 2.0, 0.1)(_COS.clone(), _TARGETS)
    target_logit = 2 * math.cos(math.acos(0.5) + 0.1)  # = 0.82208...
    expected = torch.tensor([[target_logit, -0.4, 0.2], [0.6, 1.2, -0.8]])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_circle_softmax():
    logits = _COS.clone().requires_grad_(True)
    out = build_cls_layer("CircleSoftmax", 3, 2.0, 0.25)(logits, _TARGETS)
    # target: alpha_p = 1.25 - 0.5 = 0.75, 0.75 * (0.5 - 0.75) = -0.1875
    # others: alpha_n = max(c + 0.25, 0), alpha_n * (c - 0.25)
    def neg(c):
        return max(c + 0.25, 0.0) * (c - 0.25)
    expected = 2 * torch.tensor([[-0.1875, neg(-0.2), neg(0.1)],
                                 [neg(0.3), neg(0.6), neg(-0.4)]])
    torch.testing.assert_close(out, expected)
    out[0, 0].backward()
    # the self-paced weight is not differentiated: d/dc = s * alpha_p
    assert logits.grad[0, 0].item() == pytest.approx(2 * 0.75)
