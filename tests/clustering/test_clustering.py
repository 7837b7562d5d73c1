"""reid_engine.clustering against dense / brute-force references on small inputs."""

import itertools

import numpy as np
import pytest
import torch
from sklearn.cluster import DBSCAN
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from reid_engine.clustering import (
    camera_normalized,
    cluster_centroids,
    cluster_features,
    dbscan_pseudo_labels,
    jaccard_distance_graph,
    pseudo_label_quality,
)
from reid_engine.evaluation import compute_distance_matrix, iter_jaccard_distance
from tests.evaluation.reference import dense_jaccard, dense_v


def _clustered(seed, n=48, ids=6, dim=8, duplicates=False):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(ids, dim, generator=gen)
    pids = torch.randint(0, ids, (n,), generator=gen)
    feats = centers[pids] + 0.5 * torch.randn(n, dim, generator=gen)
    if duplicates:  # identical features: distance-0 pairs that must stay neighbours
        feats[7] = feats[3]
        feats[20] = feats[3]
        feats[31] = feats[11]
    return feats, pids.numpy()


def _dense_reference(feats, k1, k2, metric):
    unit = torch.nn.functional.normalize(feats, dim=1)
    dist = compute_distance_matrix(unit, unit, metric, chunk_size=7)
    dist = dist / dist.amax(1, keepdim=True)  # step 1: each row over its maximum
    v = dense_v(dist.numpy(), k1, k2)
    return dense_jaccard(v, v)


@pytest.mark.parametrize("seed,k1,k2,metric,duplicates", [
    (0, 6, 3, "cosine", False),
    (1, 10, 4, "euclidean", True),
    (2, 20, 6, "cosine", True),
])
def test_graph_equals_dense_jaccard_of_the_reference(seed, k1, k2, metric, duplicates):
    feats, _ = _clustered(seed, duplicates=duplicates)
    expected = _dense_reference(feats, k1, k2, metric)
    graph = jaccard_distance_graph(feats * 3.0, k1=k1, k2=k2, metric=metric, chunk_size=7)  # scale: normalised inside
    assert graph.dtype == np.float32 and graph.shape == (48, 48) and graph.has_sorted_indices
    np.testing.assert_allclose(graph.toarray(), np.where(expected < 1.0, expected, 0.0), atol=2e-6)
    stored = np.zeros((48, 48), dtype=bool)
    stored[np.repeat(np.arange(48), np.diff(graph.indptr)), graph.indices] = True
    np.testing.assert_array_equal(stored, (expected < 1.0 - 1e-6) | np.eye(48, dtype=bool))
    assert (graph.diagonal() == 0).all()


def test_dense_jaccard_blocks_equal_the_reference():
    feats, _ = _clustered(4, duplicates=True)
    expected = _dense_reference(feats, 8, 3, "cosine")
    unit = torch.nn.functional.normalize(feats, dim=1)
    blocks = list(iter_jaccard_distance(unit, k1=8, k2=3, chunk_size=7))
    assert [start for start, _ in blocks] == sorted(start for start, _ in blocks) and blocks[0][0] == 0
    np.testing.assert_allclose(torch.cat([b for _, b in blocks]).numpy(), expected, atol=2e-6)


def test_graph_max_distance_keeps_only_closer_pairs():
    feats, _ = _clustered(3)
    full = jaccard_distance_graph(feats, k1=8, k2=3)
    tight = jaccard_distance_graph(feats, k1=8, k2=3, max_distance=0.5)
    assert tight.nnz < full.nnz
    assert (tight.data < 0.5).all()
    kept = full.toarray()
    np.testing.assert_array_equal(tight.toarray(), np.where(kept < 0.5, kept, 0.0))


@pytest.mark.parametrize("eps,min_samples", [(0.6, 4), (0.3, 2), (0.75, 6)])
def test_dbscan_equals_sklearn_on_the_dense_matrix(eps, min_samples):
    feats, _ = _clustered(2, n=60, duplicates=True)
    graph = jaccard_distance_graph(feats, k1=10, k2=4)
    dense = graph.toarray()
    dense[graph.toarray() == 0] = 1.0  # a missing pair is at distance 1 ...
    stored = np.zeros_like(dense, dtype=bool)
    stored[np.repeat(np.arange(60), np.diff(graph.indptr)), graph.indices] = True
    dense[stored] = graph.data  # ... a stored one (explicit zeros included) at its value
    assert (dense[3, [7, 20]] == 0).all()  # the duplicates are explicit zeros
    expected = DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit_predict(dense)
    labels = dbscan_pseudo_labels(graph, eps, min_samples)
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(labels == -1, expected == -1)
    # Same partition, numbered by first appearance.
    assert adjusted_rand_score(labels, expected) == 1.0 or (labels == -1).all()
    firsts = [labels[labels >= 0][np.nonzero(labels[labels >= 0] == c)[0][0]] for c in np.unique(labels[labels >= 0])]
    seen = list(dict.fromkeys(labels[labels >= 0].tolist()))
    assert seen == list(range(len(seen))) and sorted(firsts) == seen


@pytest.mark.parametrize("eps", [0.3, 0.6, 0.75])
def test_the_hook_clusters_a_graph_cut_at_eps_as_the_full_graph(eps):
    """cluster_features (the hook's clustering) keeps only the pairs within PSEUDO.EPS: the labels of the full graph."""
    feats, _ = _clustered(4, n=80, duplicates=True)
    feats = torch.nn.functional.normalize(feats, dim=1)
    full = dbscan_pseudo_labels(jaccard_distance_graph(feats, k1=10, k2=4), eps, 3)
    labels = cluster_features(feats.numpy(), eps=eps, min_samples=3, k1=10, k2=4)
    np.testing.assert_array_equal(labels, full)
    assert len(set(full.tolist()) - {-1}) >= 2  # a real clustering, not all outliers


def test_cluster_features_with_cameras_clusters_the_camera_normalised_features():
    """camids (PSEUDO.CAMERA_NORM) cluster camera_normalized(features), not the features as they are."""
    feats, _ = _clustered(4, n=80, duplicates=True)
    feats = torch.nn.functional.normalize(feats, dim=1).numpy()
    camids = np.arange(len(feats)) % 3
    opts = {"eps": 0.6, "min_samples": 3, "k1": 10, "k2": 4}
    expected = cluster_features(camera_normalized(feats, camids), **opts)
    np.testing.assert_array_equal(cluster_features(feats, camids=camids, **opts), expected)


def test_dbscan_duplicates_count_as_neighbours():
    # Three identical points and one far away: the zeros between the three are neighbours.
    feats = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [-1.0, 0.0]])
    graph = jaccard_distance_graph(feats, k1=2, k2=1)
    labels = dbscan_pseudo_labels(graph, eps=0.1, min_samples=3)
    np.testing.assert_array_equal(labels, [0, 0, 0, -1, -1, -1])


def test_dbscan_bad_input():
    with pytest.raises(ValueError, match="sparse"):
        dbscan_pseudo_labels(np.zeros((3, 3)), 0.5, 2)
    with pytest.raises(ValueError, match="eps"):
        dbscan_pseudo_labels(jaccard_distance_graph(torch.eye(4), k1=2, k2=1), 0.0, 2)


def test_cluster_centroids_are_normalised_means_without_outliers():
    feats = torch.tensor([[2.0, 0.0], [0.0, 2.0], [5.0, 5.0], [0.0, -3.0], [1.0, 1.0]])
    labels = np.array([1, 0, -1, 0, 1])
    centroids = cluster_centroids(feats, labels)
    expected = torch.nn.functional.normalize(torch.tensor([[0.0, -0.5], [1.5, 0.5]]), dim=1)
    np.testing.assert_allclose(centroids.numpy(), expected.numpy(), rtol=1e-6)
    assert cluster_centroids(feats, np.full(5, -1)).shape == (0, 2)


def _brute_pairs(pred, truth):
    singles = pred.copy()
    singles[pred < 0] = -1 - np.arange((pred < 0).sum())  # outliers: each its own cluster
    same_pred = same_true = both = 0
    for i, j in itertools.combinations(range(len(pred)), 2):
        p, t = singles[i] == singles[j], truth[i] == truth[j]
        same_pred += p
        same_true += t
        both += p and t
    return both / same_pred if same_pred else 0.0, both / same_true if same_true else 0.0


@pytest.mark.parametrize("seed", range(4))
def test_quality_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 7, 60) * 10 + 3
    pred = np.where(rng.random(60) < 0.7, truth // 10, rng.integers(-1, 9, 60))
    quality = pseudo_label_quality(pred, truth)
    precision, recall = _brute_pairs(pred, truth)
    assert quality["pairwise_precision"] == pytest.approx(precision)
    assert quality["pairwise_recall"] == pytest.approx(recall)
    assert quality["pairwise_f1"] == pytest.approx(2 * precision * recall / (precision + recall))
    singles = pred.copy()
    singles[pred < 0] = 100 + np.arange((pred < 0).sum())
    assert quality["nmi"] == pytest.approx(normalized_mutual_info_score(truth, singles))
    assert quality["ari"] == pytest.approx(adjusted_rand_score(truth, singles))
    assert quality["num_outliers"] == (pred == -1).sum()
    assert quality["num_clusters"] == len(set(pred[pred >= 0]))


def test_quality_perfect_and_all_outliers():
    truth = np.array([5, 5, 7, 7, 7, 9])
    perfect = pseudo_label_quality(np.array([0, 0, 1, 1, 1, 2]), truth)
    assert perfect["nmi"] == pytest.approx(1.0) and perfect["ari"] == pytest.approx(1.0)
    assert perfect["pairwise_precision"] == perfect["pairwise_recall"] == perfect["pairwise_f1"] == 1.0
    none = pseudo_label_quality(np.full(6, -1), truth)
    assert none["pairwise_precision"] == none["pairwise_recall"] == 0.0 and none["num_outliers"] == 6
