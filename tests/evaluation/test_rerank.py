"""k-reciprocal re-ranking against a dense, loop-based implementation of the reference steps."""
import numpy as np
import pytest
import torch

from reid_engine.evaluation import compute_distance_matrix, iter_rerank_chunks, k_reciprocal_rerank

from .reference import dense_rerank


def _pool(seed, num_query, num_gallery, dim=8, ids=6, duplicates=False):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(ids, dim, generator=gen)
    pids = torch.randint(0, ids, (num_query + num_gallery,), generator=gen)
    feats = centers[pids] + 0.7 * torch.randn(num_query + num_gallery, dim, generator=gen)
    if duplicates:  # exact distance ties exercise the stable neighbour order
        feats[num_query + 3] = feats[num_query + 1]
        feats[2] = feats[num_query + 5]
    return feats[:num_query], feats[num_query:]


def _dense_expected(qf, gf, k1, k2, lam, metric, chunk):
    pool = torch.cat([qf, gf])
    dist = compute_distance_matrix(pool, pool, metric, chunk_size=chunk)  # the same float32 values
    return dense_rerank(_row_normalised(dist).numpy(), qf.shape[0], k1, k2, lam)


def _row_normalised(dist):
    """Step 1 of the protocol: each row divided by that row's maximum."""
    return dist / dist.amax(1, keepdim=True)


@pytest.mark.parametrize("seed,k1,k2,metric,duplicates", [
    (0, 6, 3, "cosine", False),
    (1, 5, 1, "euclidean", False),
    (2, 20, 6, "cosine", True),
    (3, 7, 4, "euclidean", True),
])
def test_rerank_equals_dense_reference(seed, k1, k2, metric, duplicates):
    qf, gf = _pool(seed, 9, 41, duplicates=duplicates)
    chunk = 11
    expected = _dense_expected(qf, gf, k1, k2, 0.3, metric, chunk)
    got = k_reciprocal_rerank(qf, gf, k1=k1, k2=k2, lambda_value=0.3, metric=metric, chunk_size=chunk)
    assert got.shape == (9, 41)
    np.testing.assert_allclose(got.numpy(), expected, atol=2e-6)


def test_blocks_follow_query_rows():
    qf, gf = _pool(5, 12, 30)
    blocks = list(iter_rerank_chunks(qf, gf, k1=6, k2=3, chunk_size=5))
    assert [s for s, _ in blocks] == sorted(s for s, _ in blocks) and blocks[0][0] == 0
    assert sum(b.shape[0] for _, b in blocks) == 12


def test_lambda_one_gives_normalised_original_distance():
    qf, gf = _pool(4, 5, 20)
    got = k_reciprocal_rerank(qf, gf, k1=4, k2=2, lambda_value=1.0)
    pool = torch.cat([qf, gf])
    dist = compute_distance_matrix(pool, pool, "cosine")
    np.testing.assert_allclose(got.numpy(), _row_normalised(dist)[:5, 5:].numpy(), atol=1e-6)


def test_rows_not_columns_are_normalised():
    """A pool whose items live at very different scales: scaling columns reorders an item's own
    neighbours, scaling rows does not. The result must follow the rows (and so differ from columns)."""
    gen = torch.Generator().manual_seed(11)
    scales = torch.linspace(0.2, 5.0, 40).unsqueeze(1)
    feats = torch.randn(40, 6, generator=gen) * scales
    qf, gf = feats[::4], torch.cat([feats[i::4] for i in (1, 2, 3)])
    got = k_reciprocal_rerank(qf, gf, k1=6, k2=3, lambda_value=0.3, metric="euclidean").numpy()
    pool = torch.cat([qf, gf])
    dist = compute_distance_matrix(pool, pool, "euclidean")
    rows = dense_rerank(_row_normalised(dist).numpy(), qf.shape[0], 6, 3, 0.3)
    columns = dense_rerank((dist / dist.amax(0, keepdim=True)).numpy(), qf.shape[0], 6, 3, 0.3)
    np.testing.assert_allclose(got, rows, atol=1e-5)
    assert np.abs(got - columns).max() > 1e-2
    # row scaling keeps each item's own neighbour order
    order = torch.sort(dist, dim=1, stable=True).indices
    assert torch.equal(order, torch.sort(_row_normalised(dist), dim=1, stable=True).indices)


def test_bad_parameters():
    qf, gf = _pool(4, 3, 10)
    with pytest.raises(ValueError, match="TEST.RERANK"):
        k_reciprocal_rerank(qf, gf, k1=0)


def test_nearest_of_normalised_rows_without_dividing_the_block_is_exact():
    """The fast neighbour search equals ranking the divided block by (value, index), also
    where raw values tie and where division merges distinct raw values into ties."""
    from reid_engine.evaluation.rerank import _nearest_normalised, _stable_nearest

    gen = torch.Generator().manual_seed(0)
    dist = torch.randint(0, 12, (64, 50), generator=gen).float() / 7.0  # many exact ties
    row_max = dist.amax(1) + torch.rand(64, generator=gen)
    # Row 0: raw values one ulp apart that the division by 3 makes equal, across the boundary.
    base = torch.tensor(1.5001449584960938)
    dist[0] = 2.0
    dist[0, :5] = 0.5
    dist[0, 40] = base
    dist[0, 7] = torch.nextafter(base, torch.tensor(3.0))
    row_max[0] = 3.0
    assert dist[0, 7] / 3.0 == dist[0, 40] / 3.0 and dist[0, 7] != dist[0, 40]
    for k in (1, 5, 6, 13, 49, 50):
        expected = _stable_nearest(dist / row_max[:, None], k)
        assert torch.equal(_nearest_normalised(dist, row_max, k), expected), k
    # k = 6 on row 0: the tie made by the division is broken by index (7 before 40)
    assert _nearest_normalised(dist, row_max, 6)[0].tolist() == [0, 1, 2, 3, 4, 7]
