"""Losses against hand-computed values on tiny inputs; the registry and build_losses."""
import math

import pytest
import torch
from torch.nn import functional as F

from reid_engine.config import ConfigError, get_cfg
from reid_engine.modeling.losses import (
    LOSS_REGISTRY,
    build_losses,
    cross_entropy_loss,
    focal_loss,
    hard_example_mining,
    pairwise_circle_loss,
    pairwise_cosface_loss,
    triplet_loss,
    weighted_example_mining,
)
from reid_engine.modeling.losses.pairwise import euclidean_dist, identity_masks
from reid_engine.utils.registry import UnknownChoiceError

from ._helpers import run_loss_on_two_workers

LN2 = math.log(2.0)
# softmax(log([1, 2, 1])) = [0.25, 0.5, 0.25]
LOGITS = torch.log(torch.tensor([[1.0, 2.0, 1.0], [1.0, 2.0, 1.0]]))
LOGIT_TARGETS = torch.tensor([1, 0])

# 1-D features: distances are differences. Identities: three of id 0, one of id 1.
TRI_FEATS = torch.tensor([[0.0], [2.0], [5.0], [3.0]])
TRI_TARGETS = torch.tensor([0, 0, 0, 1])


def _softplus(x):
    return math.log1p(math.exp(x))


# ---- cross entropy -----------------------------------------------------------------

def test_cross_entropy_without_smoothing_is_plain_cross_entropy():
    logits = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([0, 3, 6, 2, 2])
    assert torch.allclose(cross_entropy_loss(logits, targets, eps=0.0), F.cross_entropy(logits, targets))


def test_cross_entropy_fixed_smoothing_matches_formula():
    # eps 0.1, C=3: target gets 0.9, the others 0.05 each.
    # sample 0 (p_t=0.5):  -(0.9 ln .5 + 0.05 ln .25 + 0.05 ln .25) = 1.1 ln 2
    # sample 1 (p_t=0.25): -(0.9 ln .25 + 0.05 ln .5 + 0.05 ln .25) = 1.95 ln 2
    loss = cross_entropy_loss(LOGITS, LOGIT_TARGETS, eps=0.1)
    assert loss.item() == pytest.approx((1.1 + 1.95) / 2 * LN2, rel=1e-6)


def test_cross_entropy_adaptive_smoothing_uses_true_class_probability():
    # eps_i = alpha * p_t: sample 0 -> 0.2 * 0.5 = 0.1 (loss 1.1 ln 2);
    # sample 1 -> 0.2 * 0.25 = 0.05: -(0.95 ln .25 + 0.025 ln .5 + 0.025 ln .25) = 1.975 ln 2
    loss = cross_entropy_loss(LOGITS, LOGIT_TARGETS, eps=-1, alpha=0.2)
    assert loss.item() == pytest.approx((1.1 + 1.975) / 2 * LN2, rel=1e-6)


def test_adaptive_smoothing_is_not_differentiated():
    logits = torch.randn(4, 5, generator=torch.Generator().manual_seed(1), requires_grad=True)
    targets = torch.tensor([0, 1, 2, 4])
    cross_entropy_loss(logits, targets, eps=-1, alpha=0.3).backward()
    # reference: the same smoothing as constants
    ref_logits = logits.detach().clone().requires_grad_()
    log_probs = F.log_softmax(ref_logits, 1)
    eps = 0.3 * log_probs.detach().exp().gather(1, targets[:, None])
    soft = torch.full_like(log_probs, 0.0) + eps / 4
    soft.scatter_(1, targets[:, None], 1 - eps)
    (-(soft * log_probs).sum(1).mean()).backward()
    assert torch.allclose(logits.grad, ref_logits.grad, atol=1e-6)


# ---- focal -----------------------------------------------------------------------------

def test_focal_loss_matches_formula():
    # -alpha (1 - p_t)^gamma ln p_t: sample 0: 0.25 * 0.25 * ln 2; sample 1: 0.25 * 0.5625 * 2 ln 2
    loss = focal_loss(LOGITS, LOGIT_TARGETS, alpha=0.25, gamma=2)
    assert loss.item() == pytest.approx((0.0625 * LN2 + 0.25 * 0.5625 * 2 * LN2) / 2, rel=1e-6)
    per_sample = focal_loss(LOGITS, LOGIT_TARGETS, alpha=0.25, gamma=2, reduction="none")
    assert per_sample.shape == (2,)


def test_focal_loss_with_gamma_zero_is_scaled_cross_entropy():
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    targets = torch.tensor([0, 1, 2, 3, 0, 1])
    assert torch.allclose(focal_loss(logits, targets, alpha=0.5, gamma=0),
                          0.5 * F.cross_entropy(logits, targets), atol=1e-6)


# ---- triplet ---------------------------------------------------------------------------

def test_hard_mining_picks_hardest_positive_and_negative():
    dist_mat = euclidean_dist(TRI_FEATS, TRI_FEATS)
    is_pos, is_neg = identity_masks(TRI_TARGETS, exclude_self=False)
    dist_ap, dist_an = hard_example_mining(dist_mat, is_pos, is_neg)
    # anchor 0 at 0: positives at 2 and 5 -> 5; negative at 3 -> 3
    # anchor 1 at 2: positives at 0 and 5 -> 3; negative -> 1
    # anchor 2 at 5: positives at 0 and 2 -> 5; negative -> 2
    # anchor 3 at 3 (only id 1): positive = itself (~0); negatives at 0, 2, 5 -> nearest 1
    assert torch.allclose(dist_ap, torch.tensor([5.0, 3.0, 5.0, 0.0]), atol=1e-5)
    assert torch.allclose(dist_an, torch.tensor([3.0, 1.0, 2.0, 1.0]), atol=1e-5)


def test_triplet_hard_mining_margin_value():
    loss = triplet_loss(TRI_FEATS, TRI_TARGETS, margin=0.3, norm_feat=False, hard_mining=True)
    # relu(ap - an + 0.3): 2.3, 2.3, 3.3, 0
    assert loss.item() == pytest.approx((2.3 + 2.3 + 3.3 + 0.0) / 4, abs=1e-5)


def test_triplet_soft_margin_value():
    loss = triplet_loss(TRI_FEATS, TRI_TARGETS, margin=0.0, norm_feat=False, hard_mining=True)
    expected = sum(_softplus(g) for g in (2.0, 2.0, 3.0, -1.0)) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-5)


def test_triplet_weighted_mining_value():
    # Positives weighted by softmax(d) over the positives (the anchor itself included, d=0),
    # negatives by softmax(-d) over the negatives.
    def weighted(dists, sign):
        weights = [math.exp(sign * d) for d in dists]
        return sum(w * d for w, d in zip(weights, dists)) / sum(weights)

    positives = {0: [0, 2, 5], 1: [2, 0, 3], 2: [5, 3, 0], 3: [0]}
    negatives = {0: [3], 1: [1], 2: [2], 3: [3, 1, 2]}
    expected = sum(max(0.0, weighted(positives[a], 1) - weighted(negatives[a], -1) + 0.3)
                   for a in range(4)) / 4
    loss = triplet_loss(TRI_FEATS, TRI_TARGETS, margin=0.3, norm_feat=False, hard_mining=False)
    assert loss.item() == pytest.approx(expected, abs=1e-5)

    dist_mat = euclidean_dist(TRI_FEATS, TRI_FEATS)
    dist_ap, _ = weighted_example_mining(dist_mat, *identity_masks(TRI_TARGETS, exclude_self=False))
    assert dist_ap[0].item() == pytest.approx(weighted(positives[0], 1), abs=1e-5)


def test_triplet_norm_feat_normalises_first():
    feats = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
    targets = torch.tensor([0, 0, 1, 1, 2, 2])
    scaled = feats * torch.tensor([[1.0], [3.0], [0.5], [2.0], [7.0], [1.5]])
    loss = triplet_loss(scaled, targets, 0.3, norm_feat=True, hard_mining=True)
    reference = triplet_loss(F.normalize(feats, dim=1), targets, 0.3, norm_feat=False, hard_mining=True)
    assert loss.item() == pytest.approx(reference.item(), abs=1e-5)
    assert loss.item() != pytest.approx(triplet_loss(scaled, targets, 0.3, False, True).item(), abs=1e-3)


def test_triplet_without_negatives_is_zero_with_finite_gradient():
    feats = torch.randn(4, 3, requires_grad=True)
    for hard in (True, False):
        loss = triplet_loss(feats, torch.zeros(4, dtype=torch.long), 0.3, False, hard)
        loss.backward()
        assert loss.item() == 0.0 and torch.isfinite(feats.grad).all()


# ---- circle and cosface ----------------------------------------------------------------

# unit vectors: id 0 at 0 and 90 degrees, id 1 at 45 degrees
PAIR_FEATS = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
PAIR_TARGETS = torch.tensor([0, 0, 1])
COS45 = math.sqrt(0.5)


def test_circle_loss_tiny_case():
    m, gamma = 0.25, 2.0
    # anchors 0 and 1: s_p = 0, s_n = cos45; anchor 2 has no positive -> 0
    logit_p = -gamma * (1 + m - 0.0) * (0.0 - (1 - m))
    logit_n = gamma * (COS45 + m) * (COS45 - m)
    expected = 2 * _softplus(logit_p + logit_n) / 3
    loss = pairwise_circle_loss(PAIR_FEATS, PAIR_TARGETS, margin=m, gamma=gamma)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_cosface_tiny_case():
    m, gamma = 0.25, 2.0
    expected = 2 * _softplus(-gamma * 0.0 + gamma * (COS45 + m)) / 3
    loss = pairwise_cosface_loss(PAIR_FEATS, PAIR_TARGETS, margin=m, gamma=gamma)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_circle_loss_matches_paper_double_sum():
    # log(1 + sum_n sum_p exp(gamma a_n (s_n - m) - gamma a_p (s_p - 1 + m))), mean over anchors
    feats = torch.randn(6, 5, generator=torch.Generator().manual_seed(4))
    targets = torch.tensor([0, 0, 0, 1, 1, 2])
    m, gamma = 0.3, 4.0
    sim = F.normalize(feats, dim=1) @ F.normalize(feats, dim=1).t()
    total = 0.0
    for a in range(6):
        acc = 0.0
        for p in range(6):
            if p == a or targets[p] != targets[a]:
                continue
            sp = sim[a, p].item()
            for n in range(6):
                if targets[n] == targets[a]:
                    continue
                sn = sim[a, n].item()
                acc += math.exp(gamma * max(sn + m, 0) * (sn - m) - gamma * max(1 + m - sp, 0) * (sp - 1 + m))
        total += math.log1p(acc)
    loss = pairwise_circle_loss(feats, targets, margin=m, gamma=gamma)
    assert loss.item() == pytest.approx(total / 6, rel=1e-5)


def test_pairwise_losses_have_finite_gradients_with_large_gamma():
    feats = torch.randn(8, 16, generator=torch.Generator().manual_seed(5), requires_grad=True)
    targets = torch.tensor([0, 0, 1, 1, 2, 2, 3, 4])  # ids 3 and 4 have no positive
    for fn in (pairwise_circle_loss, pairwise_cosface_loss):
        feats.grad = None
        fn(feats, targets, 0.25, 128.0).backward()
        assert torch.isfinite(feats.grad).all() and feats.grad.abs().sum() > 0


# ---- registry and build_losses -----------------------------------------------------------

def _outputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(8, 4, generator=gen)
    return {"cls_outputs": logits * 2, "pred_class_logits": logits, "features": torch.randn(8, 6, generator=gen)}


TARGETS = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])


def test_registry_maps_every_configured_name():
    assert {name for name, _ in LOSS_REGISTRY} == {
        "CrossEntropyLoss", "TripletLoss", "CircleLoss", "Cosface", "FocalLoss"}
    cfg = get_cfg()
    cfg.MODEL.LOSSES.NAME = ("CrossEntropyLoss", "TripletLoss", "CircleLoss", "Cosface", "FocalLoss")
    terms = build_losses(cfg)(_outputs(), TARGETS)
    assert set(terms) == {"loss_cls", "loss_triplet", "loss_circle", "loss_cosface", "loss_focal"}
    assert all(t.dim() == 0 and torch.isfinite(t) for t in terms.values())


def test_each_loss_reads_its_section_and_applies_scale():
    cfg = get_cfg()
    cfg.MODEL.LOSSES.NAME = ("CrossEntropyLoss", "TripletLoss", "CircleLoss", "Cosface", "FocalLoss")
    losses = cfg.MODEL.LOSSES
    losses.CE.EPSILON, losses.CE.SCALE = 0.1, 2.0
    losses.TRI.MARGIN, losses.TRI.HARD_MINING, losses.TRI.NORM_FEAT, losses.TRI.SCALE = 0.5, True, False, 3.0
    losses.CIRCLE.MARGIN, losses.CIRCLE.GAMMA, losses.CIRCLE.SCALE = 0.3, 16, 0.5
    losses.COSFACE.MARGIN, losses.COSFACE.GAMMA, losses.COSFACE.SCALE = 0.2, 8, 0.25
    losses.FL.ALPHA, losses.FL.GAMMA, losses.FL.SCALE = 0.5, 1.0, 4.0
    out = _outputs(1)
    terms = build_losses(cfg)(out, TARGETS)
    logits, feats = out["cls_outputs"], out["features"]
    expected = {
        "loss_cls": 2.0 * cross_entropy_loss(logits, TARGETS, 0.1),
        "loss_triplet": 3.0 * triplet_loss(feats, TARGETS, 0.5, False, True),
        "loss_circle": 0.5 * pairwise_circle_loss(feats, TARGETS, 0.3, 16),
        "loss_cosface": 0.25 * pairwise_cosface_loss(feats, TARGETS, 0.2, 8),
        "loss_focal": 4.0 * focal_loss(logits, TARGETS, 0.5, 1.0),
    }
    for key, value in expected.items():
        assert terms[key].item() == pytest.approx(value.item(), rel=1e-6), key


def test_unknown_loss_name_lists_the_registered_ones():
    cfg = get_cfg()
    cfg.MODEL.LOSSES.NAME = ("CrossEntropyLoss", "ArcLoss")
    with pytest.raises(UnknownChoiceError, match="unknown MODEL.LOSSES.NAME 'ArcLoss': choose one of "
                                                 "CircleLoss.*TripletLoss"):
        build_losses(cfg)
    cfg.MODEL.LOSSES.NAME = ("CrossEntropy",)
    with pytest.raises(UnknownChoiceError, match="did you mean CrossEntropyLoss[?]"):
        build_losses(cfg)


@pytest.mark.parametrize("names, message", [
    ((), "MODEL.LOSSES.NAME is empty"), (("TripletLoss", "TripletLoss"), "lists a loss twice")])
def test_empty_or_repeated_loss_names_are_config_errors(names, message):
    cfg = get_cfg()
    cfg.MODEL.LOSSES.NAME = names
    with pytest.raises(ConfigError, match=message):
        build_losses(cfg)


@pytest.mark.parametrize("key, value, pattern", [
    ("CE.EPSILON", 1.5, "CE.EPSILON"), ("TRI.MARGIN", -0.1, "TRI.MARGIN"),
    ("CIRCLE.GAMMA", 0, "CIRCLE.GAMMA")])
def test_bad_loss_settings_are_clear_errors(key, value, pattern):
    cfg = get_cfg()
    cfg.MODEL.LOSSES.NAME = ("CrossEntropyLoss", "TripletLoss", "CircleLoss")
    section, name = key.split(".")
    cfg.MODEL.LOSSES[section][name] = value
    with pytest.raises(ConfigError, match=pattern):
        build_losses(cfg)


def test_missing_head_output_is_a_clear_error():
    cfg = get_cfg()
    cfg.MODEL.LOSSES.NAME = ("TripletLoss",)
    with pytest.raises(ValueError, match="'features'"):
        build_losses(cfg)({"cls_outputs": torch.zeros(2, 2)}, torch.tensor([0, 1]))


# ---- distributed triplet ------------------------------------------------------------------

def _gathered_triplet(local, targets):
    return triplet_loss(local, targets, 0.3, False, True), None


def test_triplet_gathers_across_workers_with_gradient_to_local_part(tmp_path):
    feats = torch.randn(8, 5, generator=torch.Generator().manual_seed(6))
    targets = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])  # every positive lives on the other worker
    results = run_loss_on_two_workers(_gathered_triplet, feats, targets, tmp_path)
    full = feats.clone().requires_grad_()
    full_loss = triplet_loss(full, targets, 0.3, False, True)
    full_loss.backward()
    for rank, result in enumerate(results):
        assert result["loss"].item() == pytest.approx(full_loss.item(), rel=1e-5)
        assert torch.allclose(result["grad"], full.grad.chunk(2)[rank], atol=1e-6)
