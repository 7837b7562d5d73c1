"""Distances: values against direct formulas, chunking, input checks."""
import numpy as np
import pytest
import torch

from reid_engine.evaluation import compute_distance_matrix, iter_distance_chunks
from reid_engine.utils.registry import UnknownChoiceError


def _features():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(13, 8, generator=gen), torch.randn(29, 8, generator=gen)


def test_cosine_is_one_minus_cos():
    q, g = _features()
    expected = 1 - torch.nn.functional.normalize(q.double()) @ torch.nn.functional.normalize(g.double()).T
    got = compute_distance_matrix(q, g, "cosine", chunk_size=4)
    torch.testing.assert_close(got.double(), expected, atol=1e-6, rtol=0)


def test_euclidean_is_squared_l2():
    q, g = _features()
    expected = torch.cdist(q.double(), g.double()).pow(2)
    got = compute_distance_matrix(q, g, "euclidean", chunk_size=5)
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-5)
    assert (got >= 0).all()
    same = compute_distance_matrix(q, q, "euclidean")
    assert same.diagonal().abs().max() < 1e-4


def test_chunks_cover_rows_in_order():
    q, g = _features()
    starts = [(s, d.shape) for s, d in iter_distance_chunks(q, g, "cosine", chunk_size=5)]
    assert starts == [(0, (5, 29)), (5, (5, 29)), (10, (3, 29))]


def test_numpy_input_and_errors():
    q, g = _features()
    got = compute_distance_matrix(q.numpy(), g.numpy(), "cosine")
    torch.testing.assert_close(got, compute_distance_matrix(q, g, "cosine"))
    with pytest.raises(UnknownChoiceError, match="unknown TEST.METRIC .hamming.: choose one of cosine, euclidean"):
        compute_distance_matrix(q, g, "hamming")
    with pytest.raises(ValueError, match="dimension"):
        compute_distance_matrix(q, g[:, :4], "cosine")
    bad = q.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        compute_distance_matrix(bad, g, "cosine")


def test_half_features_on_cpu_are_widened():
    q, g = _features()
    got = compute_distance_matrix(q.half(), g.half(), "cosine")
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), compute_distance_matrix(q, g).numpy(), atol=5e-3)
