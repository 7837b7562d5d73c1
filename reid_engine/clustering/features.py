"""A feature pool to pseudo labels in one call: optional camera normalisation, the k-reciprocal
Jaccard graph cut at the DBSCAN radius, then DBSCAN."""

from typing import Optional

import numpy as np
import torch

from .graph import jaccard_distance_graph
from .labels import dbscan_max_distance, dbscan_pseudo_labels

__all__ = ["camera_normalized", "cluster_features"]


def camera_normalized(features: np.ndarray, camids: np.ndarray) -> np.ndarray:
    """Subtract each camera's mean feature, then renormalise the rows (PSEUDO.CAMERA_NORM).

    Args:
        features: (T, D) features.
        camids: (T,) their cameras.
    Returns:
        (T, D) float32 unit rows.
    """
    out = np.array(features, dtype=np.float32, copy=True)
    for cam in np.unique(camids):
        rows = camids == cam
        out[rows] -= out[rows].mean(axis=0, keepdims=True)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def cluster_features(features: np.ndarray, *, eps: float, min_samples: int, k1: int, k2: int,
                     chunk_size: Optional[int] = None, camids: Optional[np.ndarray] = None) -> np.ndarray:
    """Cluster a feature pool: k-reciprocal Jaccard graph (only the pairs DBSCAN can use), then DBSCAN.

    Args:
        features: (T, D) float32 L2-normalised features.
        eps: the DBSCAN radius on the Jaccard distance (PSEUDO.EPS).
        min_samples: DBSCAN's core-point neighbours, itself included (PSEUDO.MIN_SAMPLES).
        k1: size of the k-reciprocal sets (PSEUDO.K1).
        k2: size of the local query expansion (PSEUDO.K2).
        chunk_size: feature rows per block of the Jaccard computation; None: automatic.
        camids: (T,) cameras of the features: when given, the features are
            :func:`camera_normalized` first (PSEUDO.CAMERA_NORM); None clusters them as they are.
    Returns:
        (T,) int64 clusters 0..C-1, -1 for outliers.
    """
    if camids is not None:
        features = camera_normalized(features, camids)
    graph = jaccard_distance_graph(torch.from_numpy(features), k1=k1, k2=k2, max_distance=dbscan_max_distance(eps),
                                   chunk_size=chunk_size)
    return dbscan_pseudo_labels(graph, eps, min_samples)
