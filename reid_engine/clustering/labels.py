"""Pseudo labels from the Jaccard graph (DBSCAN), and the centroids of the clusters."""

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    import scipy.sparse

__all__ = ["dbscan_pseudo_labels", "dbscan_max_distance", "cluster_centroids"]


def dbscan_max_distance(eps: float) -> float:
    """The ``max_distance`` of :func:`jaccard_distance_graph` that keeps every pair DBSCAN can use.

    DBSCAN looks only at pairs within ``eps``, so a graph cut there gives the labels of the
    full graph with a fraction of its pairs. The graph compares float32 distances with its
    bound (``<``) and DBSCAN compares them with ``eps`` in float64 (``<=``): the small margin
    keeps a pair whose float32 distance rounds to ``eps``.

    Args:
        eps: the DBSCAN radius (below 1: pairs at distance 1 are never stored).

    Returns:
        float: the bound to pass as ``max_distance``.
    """
    return min(1.0, eps + 1e-6)


def dbscan_pseudo_labels(graph: "scipy.sparse.csr_matrix", eps: float, min_samples: int) -> np.ndarray:
    """Cluster a precomputed sparse distance graph with scikit-learn's DBSCAN.

    Stored entries (explicit zeros included) are the candidate neighbours; a missing
    entry is farther than any ``eps`` (the graph of :func:`jaccard_distance_graph` keeps
    every pair closer than its ``max_distance``, so use ``eps < max_distance``, e.g.
    :func:`dbscan_max_distance`).

    Args:
        graph: (N, N) sparse distances, e.g. from :func:`jaccard_distance_graph`.
        eps: the neighbourhood radius (cluster contrast: 0.6).
        min_samples: points within ``eps`` (itself included) that make a core point
            (cluster contrast: 4).

    Returns:
        numpy.ndarray: (N,) int64 labels, -1 for outliers, the clusters numbered
        0..C-1 in the order of their first item.
    """
    import scipy.sparse  # scipy and scikit-learn are imported only where clustering runs
    from sklearn.cluster import DBSCAN
    from sklearn.neighbors import sort_graph_by_row_values

    if not scipy.sparse.issparse(graph) or graph.shape[0] != graph.shape[1]:
        raise ValueError(f"dbscan_pseudo_labels needs a square sparse distance graph, got {type(graph).__name__} "
                         f"of shape {getattr(graph, 'shape', None)}")
    if eps <= 0 or min_samples < 1:
        raise ValueError(f"DBSCAN needs eps > 0 and min_samples >= 1, got eps={eps}, min_samples={min_samples}")
    # scikit-learn wants each row sorted by distance; sorting here spares its warning (and a second copy).
    graph = sort_graph_by_row_values(graph.tocsr(), copy=True, warn_when_not_sorted=False)
    raw = DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit_predict(graph)
    labels = np.full(raw.shape, -1, dtype=np.int64)
    clustered = raw >= 0
    # np.unique's first indices give each cluster's first item; rank the clusters by them.
    values, first = np.unique(raw[clustered], return_index=True)
    new_id = np.empty(values.size, dtype=np.int64)
    new_id[np.argsort(first, kind="stable")] = np.arange(values.size)
    labels[clustered] = new_id[np.searchsorted(values, raw[clustered])]
    return labels


def cluster_centroids(features: torch.Tensor, labels: np.ndarray) -> torch.Tensor:
    """The L2-normalised mean feature of each cluster (outliers, label -1, skipped).

    Args:
        features: (N, D) features.
        labels: (N,) int labels 0..C-1, -1 for outliers.

    Returns:
        torch.Tensor: (C, D) float32 centroids on the features' device, row c for label c.
    """
    labels_t = torch.as_tensor(np.asarray(labels), dtype=torch.int64, device=features.device)
    if labels_t.shape != features.shape[:1]:
        raise ValueError(f"cluster_centroids: {labels_t.numel()} labels for {features.shape[0]} features")
    keep = labels_t >= 0
    num_clusters = int(labels_t.max()) + 1 if bool(keep.any()) else 0
    sums = torch.zeros(num_clusters, features.shape[1], dtype=torch.float32, device=features.device)
    sums.index_add_(0, labels_t[keep], features[keep].detach().float())
    return F.normalize(sums, dim=1)
