"""The sorted-key formulation of the rank metrics: exactness on hard cases, its helpers, row splitting."""
import numpy as np
import pytest
import torch

import reid_engine.evaluation.rank as rank_module
from reid_engine.evaluation import evaluate_rank

from .reference import protocol_metrics


def _hard_case(seed, num_query=41, num_gallery=263, ids=14, cams=3, levels=5, dtype=np.float32):
    """Distances with many exact ties (also -0.0 against 0.0 and negatives), single-match rows and
    queries without a valid match (an id absent from the gallery, an id seen only by the query's camera)."""
    rng = np.random.default_rng(seed)
    g_pids, g_cams = rng.integers(0, ids, num_gallery), rng.integers(0, cams, num_gallery)
    q_pids, q_cams = rng.integers(0, ids, num_query), rng.integers(0, cams, num_query)
    g_pids[:2], g_cams[:2] = [ids, ids + 1], [0, 1]  # ids with a single gallery image
    q_pids[:4], q_cams[:4] = [ids, ids + 1, ids + 2, ids + 3], [1, 0, 0, 0]  # two single matches, two absent ids
    g_pids[2:5], g_cams[2:5] = ids + 4, 2  # id ids + 4: three images, all on camera 2 ...
    q_pids[4], q_cams[4] = ids + 4, 2  # ... and so only junk for this query
    dist = (rng.integers(0, levels, (num_query, num_gallery)) - 1).astype(dtype) * 0.25
    dist[dist == 0] = np.where(rng.random(int((dist == 0).sum())) < 0.5, -0.0, 0.0)
    return dist, q_pids, g_pids, q_cams, g_cams


def _assert_oracle(got, expected):
    np.testing.assert_allclose(got[0], expected[0], atol=1e-12)
    assert got[1] == pytest.approx(expected[1], abs=1e-12)
    assert got[2] == pytest.approx(expected[2], abs=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("seed", range(4))
def test_matches_oracle_on_ties_single_matches_and_unmatched_queries(seed, dtype):
    dist, qp, gp, qc, gc = _hard_case(seed, dtype=dtype)
    expected = protocol_metrics(dist, qp, gp, qc, gc)
    _assert_oracle(evaluate_rank(dist, qp, gp, qc, gc, chunk_size=6), expected)
    _assert_oracle(evaluate_rank(torch.from_numpy(dist), qp, gp, qc, gc), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_oracle_with_distinct_distances(dtype):
    """Mostly distinct distances, matches far down the list (many candidates) and near the top."""
    dist, qp, gp, qc, gc = _hard_case(9, dtype=dtype)
    dist = dist + np.random.default_rng(9).random(dist.shape).astype(dtype)
    dist[::2] *= -1  # half of the rows put their matches last
    _assert_oracle(evaluate_rank(dist, qp, gp, qc, gc, chunk_size=10), protocol_metrics(dist, qp, gp, qc, gc))


@pytest.mark.parametrize("budget", [1, 5, 300])
def test_split_rows_give_the_same_results_bit_for_bit(monkeypatch, budget):
    dist, qp, gp, qc, gc = _hard_case(5, levels=40)
    whole = evaluate_rank(dist, qp, gp, qc, gc)
    monkeypatch.setattr(rank_module, "MAX_CANDIDATES", budget)
    split = evaluate_rank(dist, qp, gp, qc, gc)
    assert np.array_equal(split[0], whole[0]) and split[1] == whole[1] and split[2] == whole[2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # numpy path, torch path
def test_candidate_groups_respect_the_budget_and_key_bits(monkeypatch, dtype):
    counts = [3, 0, 9, 4, 4, 1, 2, 7]
    dist = torch.arange(10, dtype=dtype).repeat(8, 1)  # row r: candidates 0 .. counts[r] - 1
    bound = torch.tensor(counts, dtype=dtype).unsqueeze(1) - 1
    no_junk = torch.zeros(0, dtype=torch.int64)

    def groups():
        return [(s, e, flat.tolist()) for s, e, flat in rank_module._candidate_groups(dist, bound, no_junk, no_junk)]

    monkeypatch.setattr(rank_module, "MAX_CANDIDATES", 8)
    found = groups()
    assert [(s, e) for s, e, _ in found] == [(0, 2), (2, 3), (3, 5), (5, 7), (7, 8)]  # a row over 8 stays whole
    for s, e, flat in found:
        assert flat == [(r - s) * 10 + c for r in range(s, e) for c in range(counts[r])]
    monkeypatch.setattr(rank_module, "MAX_CANDIDATES", 1 << 40)
    assert [(s, e) for s, e, _ in groups()] == [(0, 8)]
    # With 58 bits for the distance and 4 for the gallery index, 1 bit is left for the row.
    monkeypatch.setattr(rank_module, "_CODE_BITS", 58)
    assert [(s, e) for s, e, _ in groups()] == [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_junk_is_never_a_candidate():
    dist = torch.zeros(2, 5)
    bound = torch.zeros(2, 1)
    (_, _, flat), = rank_module._candidate_groups(dist, bound, torch.tensor([0, 1, 1]), torch.tensor([4, 0, 2]))
    assert flat.tolist() == [0, 1, 2, 3, 6, 8, 9]


def test_bfloat16_blocks_match_the_oracle(monkeypatch):
    """bfloat16 (no numpy dtype) takes torch's candidate search; also split into groups of rows."""
    dist, qp, gp, qc, gc = _hard_case(2)
    expected = protocol_metrics(dist, qp, gp, qc, gc)  # quarter steps: exact in bfloat16
    _assert_oracle(evaluate_rank(torch.from_numpy(dist).bfloat16(), qp, gp, qc, gc, chunk_size=8), expected)
    monkeypatch.setattr(rank_module, "MAX_CANDIDATES", 5)
    _assert_oracle(evaluate_rank(torch.from_numpy(dist).bfloat16(), qp, gp, qc, gc), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, "float32 in float64", torch.float64])
def test_order_codes_order_as_the_distances(dtype):
    exact = dtype == "float32 in float64"  # float64 holding float32 values: the IEEE bits of float32
    dtype = torch.float32 if exact else dtype
    values = torch.tensor([3.5, -0.0, -2.0, 0.0, 1e-3, -1e-3, 3.5, -7.25], dtype=dtype)
    queries = torch.tensor([[0.0, -2.0], [3.5, 2.0]], dtype=dtype)
    if exact:
        values, queries = values.double(), queries.double()
    codes, query_codes = rank_module._order_codes(values, queries)
    assert codes.dtype == torch.int64 and bool((codes >= 0).all()) and bool((codes < 1 << 32).all())
    both_v = torch.cat([values, queries.flatten()])
    both_c = torch.cat([codes, query_codes.flatten()])
    if dtype == torch.float64 and not exact:  # dense rank: a query not among the values (2.0) shares the next code
        assert int(query_codes[1, 1]) == int(codes[0])
        both_v, both_c = both_v[:-1], both_c[:-1]
    less = both_v.unsqueeze(1) < both_v.unsqueeze(0)
    equal = both_v.unsqueeze(1) == both_v.unsqueeze(0)  # -0.0 == 0.0
    assert bool(((both_c.unsqueeze(1) < both_c.unsqueeze(0)) == less).all())
    assert bool(((both_c.unsqueeze(1) == both_c.unsqueeze(0)) == equal).all())


def test_cpu_work_runs_on_one_thread_and_restores_the_count(monkeypatch):
    seen = []
    real = rank_module.all_finite
    monkeypatch.setattr(rank_module, "all_finite", lambda x: seen.append(torch.get_num_threads()) or real(x))
    dist, qp, gp, qc, gc = _hard_case(1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        evaluate_rank(dist, qp, gp, qc, gc, chunk_size=20)
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
        dist[3, 3] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            evaluate_rank(dist, qp, gp, qc, gc)
        assert torch.get_num_threads() == 2  # restored after an error too
    finally:
        torch.set_num_threads(before)
