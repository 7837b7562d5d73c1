"""How good pseudo labels are, measured against the ground-truth identities."""

from typing import Dict

import numpy as np

__all__ = ["pseudo_label_quality"]


def _pairs(counts: np.ndarray) -> float:
    """Number of unordered pairs inside groups of the given sizes."""
    counts = counts.astype(np.float64)
    return float((counts * (counts - 1) / 2).sum())


def pseudo_label_quality(pred: np.ndarray, truth: np.ndarray) -> Dict[str, float]:
    """NMI, ARI and pairwise precision / recall / F1 of pseudo labels against the true identities.

    Outliers (pred -1) are singletons: each is its own cluster for NMI / ARI, and takes
    part in no predicted pair (so dropping images as outliers costs recall, not
    precision). The pairwise scores count unordered image pairs: precision = pairs in
    the same predicted cluster that share the true identity / pairs in the same predicted
    cluster; recall = the same numerator / pairs that share the true identity. They come
    from the contingency counts (O(N + cells)), not from the N x N pairs. A score whose
    denominator is 0 is 0.0.

    Args:
        pred: (N,) int pseudo labels, -1 = outlier.
        truth: (N,) the true identities (any hashable integers).

    Returns:
        dict: ``nmi``, ``ari``, ``pairwise_precision``, ``pairwise_recall``, ``pairwise_f1``,
        ``num_clusters`` and ``num_outliers`` (all floats).
    """
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
    from sklearn.metrics.cluster import contingency_matrix

    pred = np.asarray(pred).astype(np.int64).ravel()
    truth = np.asarray(truth).ravel()
    if pred.shape != truth.shape:
        raise ValueError(f"pseudo_label_quality: {pred.size} pseudo labels for {truth.size} true labels")
    outlier = pred < 0
    singletons = pred.copy()
    singletons[outlier] = pred.max(initial=-1) + 1 + np.arange(int(outlier.sum()))  # each its own cluster
    table = contingency_matrix(truth, singletons, sparse=True)
    together = _pairs(table.data)
    pred_pairs = _pairs(np.asarray(table.sum(0)).ravel())
    true_pairs = _pairs(np.asarray(table.sum(1)).ravel())
    precision = together / pred_pairs if pred_pairs else 0.0
    recall = together / true_pairs if true_pairs else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "nmi": float(normalized_mutual_info_score(truth, singletons)),
        "ari": float(adjusted_rand_score(truth, singletons)),
        "pairwise_precision": float(precision),
        "pairwise_recall": float(recall),
        "pairwise_f1": float(f1),
        "num_clusters": float(np.unique(pred[~outlier]).size),
        "num_outliers": float(outlier.sum()),
    }
