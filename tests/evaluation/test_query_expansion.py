"""Alpha query expansion on hand-made features."""
import math

import numpy as np
import pytest
import torch

from reid_engine.evaluation import alpha_query_expansion


def _unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def test_one_round_by_hand():
    s = 1 / math.sqrt(2)
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0], [s, s]])
    query = torch.tensor([[2.0, 0.2]])  # normalisation first: the norm must not matter
    q, g = alpha_query_expansion(query, gallery, qe_time=1, qe_k=2, alpha=3.0)
    qn = _unit([2.0, 0.2])
    # query: itself + its nearest gallery feature g0, weight cos(q, g0) ** 3
    expected_q = _unit(qn + qn[0] ** 3 * np.array([1.0, 0.0]))
    # g0 and g1: nearest other gallery item is g2 (cos = s); g2: g0 and g1 tie at s, lower index wins
    expected_g = np.stack([
        _unit(np.array([1.0, 0.0]) + s ** 3 * np.array([s, s])),
        _unit(np.array([0.0, 1.0]) + s ** 3 * np.array([s, s])),
        _unit(np.array([s, s]) + s ** 3 * np.array([1.0, 0.0])),
    ])
    np.testing.assert_allclose(q.numpy(), expected_q[None], atol=1e-6)
    np.testing.assert_allclose(g.numpy()[:2], expected_g[:2], atol=1e-6)
    # g2's neighbour is one of the tied g0/g1: either way its expansion has this norm-1 form
    assert g.numpy()[2] @ expected_g[2] > 0.95


def test_rounds_compose_and_qe_k_one_is_identity():
    gen = torch.Generator().manual_seed(0)
    query, gallery = torch.randn(4, 6, generator=gen), torch.randn(15, 6, generator=gen)
    twice = alpha_query_expansion(query, gallery, qe_time=2, qe_k=3, alpha=2.0, chunk_size=4)
    q1, g1 = alpha_query_expansion(query, gallery, qe_time=1, qe_k=3, alpha=2.0)
    again = alpha_query_expansion(q1, g1, qe_time=1, qe_k=3, alpha=2.0)
    torch.testing.assert_close(twice[0], again[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(twice[1], again[1], atol=1e-6, rtol=0)
    same_q, _ = alpha_query_expansion(query, gallery, qe_time=1, qe_k=1)
    torch.testing.assert_close(same_q, torch.nn.functional.normalize(query))


def test_bad_parameters():
    with pytest.raises(ValueError, match="TEST.AQE"):
        alpha_query_expansion(torch.ones(1, 2), torch.ones(2, 2), qe_k=0)
