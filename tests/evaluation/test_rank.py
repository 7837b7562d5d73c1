"""Rank metrics: hand-computed cases, protocol oracle, chunk invariance, features form."""
import numpy as np
import pytest
import torch

from reid_engine.evaluation import (
    NoValidQueryError,
    compute_distance_matrix,
    evaluate_rank,
    evaluate_rank_from_features,
)

from .reference import protocol_metrics

# Gallery: (pid, camid); pid 0 is a distractor.
G_PIDS = np.array([1, 2, 1, 0, 1, 3])
G_CAMS = np.array([0, 1, 1, 1, 2, 0])
Q_PIDS = np.array([1, 2, 3, 1])
Q_CAMS = np.array([0, 0, 0, 1])
DIST = np.array([
    # q0: g0 junk; g1 (neg) ties g2 (pos) and g3 (neg) at 0.2 -> index order g1, g2, g3
    [0.1, 0.2, 0.2, 0.2, 0.5, 0.4],
    # q1: g3 distractor first, then g0 (neg) ties g1 (pos): g0 comes first
    [0.3, 0.3, 0.3, 0.1, 0.9, 0.3],
    # q2: its only same-id item g5 is same-camera junk -> no valid match, skipped
    [0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
    # q3: g2 junk; order g3 n, g4 p, g5 n, g1 n, g0 p
    [0.6, 0.5, 0.0, 0.1, 0.2, 0.3],
])


def test_hand_computed_case():
    cmc, mean_ap, mean_inp = evaluate_rank(DIST, Q_PIDS, G_PIDS, Q_CAMS, G_CAMS, max_rank=10)
    # q0 / q3: matches at positions 1 and 4 (0-based) -> AP = (1/2 + 2/5) / 2, INP = 2/5
    # q1: single match at position 2 -> AP = INP = 1/3;  q2 skipped
    assert cmc.shape == (10,)
    np.testing.assert_allclose(cmc[:3], [0.0, 2 / 3, 1.0])
    np.testing.assert_allclose(cmc[3:], 1.0)  # padded with the last value (gallery of 6 < 10)
    assert mean_ap == pytest.approx((0.45 + 1 / 3 + 0.45) / 3, abs=1e-12)
    assert mean_inp == pytest.approx((0.4 + 1 / 3 + 0.4) / 3, abs=1e-12)


def test_skipped_query_is_logged(caplog):
    caplog.set_level("INFO")
    evaluate_rank(DIST, Q_PIDS, G_PIDS, Q_CAMS, G_CAMS, max_rank=10)
    assert "1 of 4 queries have no valid match" in caplog.text


def test_tensor_inputs_match_numpy():
    a = evaluate_rank(DIST, Q_PIDS, G_PIDS, Q_CAMS, G_CAMS, max_rank=10)
    b = evaluate_rank(torch.tensor(DIST, dtype=torch.float32), torch.tensor(Q_PIDS), torch.tensor(G_PIDS),
                      torch.tensor(Q_CAMS), torch.tensor(G_CAMS), max_rank=10)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] == pytest.approx(b[1], abs=1e-12) and a[2] == pytest.approx(b[2], abs=1e-12)


def test_no_valid_query_is_a_clear_error():
    cams = np.zeros(6, dtype=np.int64)
    with pytest.raises(NoValidQueryError, match="share one camera id"):
        evaluate_rank(DIST, Q_PIDS, G_PIDS, np.zeros(4, dtype=np.int64), cams)


def test_bad_shapes_and_nan_are_clear_errors():
    with pytest.raises(ValueError, match="shape"):
        evaluate_rank(DIST[:, :5], Q_PIDS, G_PIDS, Q_CAMS, G_CAMS)
    bad = DIST.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        evaluate_rank(bad, Q_PIDS, G_PIDS, Q_CAMS, G_CAMS)


def _random_case(seed, num_query=37, num_gallery=211, ids=12, cams=3, levels=6):
    rng = np.random.default_rng(seed)
    q_pids, g_pids = rng.integers(0, ids, num_query), rng.integers(0, ids, num_gallery)
    q_cams, g_cams = rng.integers(0, cams, num_query), rng.integers(0, cams, num_gallery)
    dist = rng.integers(0, levels, (num_query, num_gallery)).astype(np.float32)  # many exact ties
    return dist, q_pids, g_pids, q_cams, g_cams


@pytest.mark.parametrize("seed", range(6))
def test_matches_protocol_oracle_with_many_ties(seed):
    dist, qp, gp, qc, gc = _random_case(seed)
    expected = protocol_metrics(dist, qp, gp, qc, gc, max_rank=50)
    cmc, mean_ap, mean_inp = evaluate_rank(dist, qp, gp, qc, gc, max_rank=50, chunk_size=5)
    np.testing.assert_allclose(cmc, expected[0], atol=1e-12)
    assert mean_ap == pytest.approx(expected[1], abs=1e-12)
    assert mean_inp == pytest.approx(expected[2], abs=1e-12)


def test_chunked_equals_unchunked_bit_for_bit():
    rng = np.random.default_rng(7)
    dist, qp, gp, qc, gc = _random_case(7, num_query=64, num_gallery=500)
    dist = dist + rng.random(dist.shape).astype(np.float32)  # ties and non-ties mixed
    reference = evaluate_rank(dist, qp, gp, qc, gc, chunk_size=64)
    for chunk in (1, 3, 17, 63):
        cmc, mean_ap, mean_inp = evaluate_rank(dist, qp, gp, qc, gc, chunk_size=chunk)
        assert np.array_equal(cmc, reference[0])
        assert mean_ap == reference[1] and mean_inp == reference[2]


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_features_form_equals_distmat_form(metric):
    gen = torch.Generator().manual_seed(3)
    centers = torch.randn(15, 16, generator=gen)
    g_pids = torch.randint(0, 15, (300,), generator=gen)
    q_pids = torch.randint(0, 15, (40,), generator=gen)
    gf = centers[g_pids] + 0.8 * torch.randn(300, 16, generator=gen)
    qf = centers[q_pids] + 0.8 * torch.randn(40, 16, generator=gen)
    g_cams, q_cams = torch.randint(0, 4, (300,), generator=gen), torch.randint(0, 4, (40,), generator=gen)
    dist = compute_distance_matrix(qf, gf, metric, chunk_size=9)
    a = evaluate_rank(dist, q_pids, g_pids, q_cams, g_cams, chunk_size=9)
    b = evaluate_rank_from_features(qf, gf, q_pids, g_pids, q_cams, g_cams, metric=metric, chunk_size=9)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1] and a[2] == b[2]
    expected = protocol_metrics(dist.numpy(), q_pids.numpy(), g_pids.numpy(), q_cams.numpy(), g_cams.numpy())
    np.testing.assert_allclose(b[0], expected[0], atol=1e-12)
    assert b[1] == pytest.approx(expected[1], abs=1e-12)


def test_cuhk03_single_gallery_shot():
    dist, qp, gp, qc, gc = _random_case(11, num_query=20, num_gallery=120, ids=8, levels=1000)
    standard = evaluate_rank(dist, qp, gp, qc, gc, max_rank=20)
    cmc, mean_ap, mean_inp = evaluate_rank(dist, qp, gp, qc, gc, max_rank=20, use_cuhk03=True, chunk_size=7)
    again = evaluate_rank(dist, qp, gp, qc, gc, max_rank=20, use_cuhk03=True, chunk_size=20)
    assert np.array_equal(cmc, again[0])  # seeded per query: independent of chunking
    assert mean_ap == standard[1] and mean_inp == standard[2]  # AP on the full list
    assert np.all(np.diff(cmc) >= 0) and cmc[-1] == 1.0
    num_valid = sum(bool(((gp == qp[i]) & (gc != qc[i])).any()) for i in range(len(qp)))
    counts = cmc * 10 * num_valid  # fractions of (query, draw) pairs
    np.testing.assert_allclose(counts, np.round(counts), atol=1e-9)


def test_cuhk03_equals_standard_with_one_image_per_pid():
    g_pids = np.arange(8)
    g_cams = np.ones(8, dtype=np.int64)
    q_pids = np.array([0, 3, 5])
    q_cams = np.zeros(3, dtype=np.int64)
    dist = np.random.default_rng(0).random((3, 8))
    standard = evaluate_rank(dist, q_pids, g_pids, q_cams, g_cams, max_rank=8)
    sgs = evaluate_rank(dist, q_pids, g_pids, q_cams, g_cams, max_rank=8, use_cuhk03=True)
    np.testing.assert_allclose(sgs[0], standard[0])
