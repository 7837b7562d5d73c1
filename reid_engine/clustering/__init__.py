"""Pseudo labels for label-free training (issue 26): the k-reciprocal Jaccard graph of a
feature pool, DBSCAN on it, cluster centroids, and the quality of pseudo labels against
ground truth.

- :func:`jaccard_distance_graph`: the sparse (N, N) Jaccard distance graph, in bounded
  memory (the machinery of ``evaluation.rerank``);
- :func:`dbscan_pseudo_labels`: scikit-learn's DBSCAN on that graph, labels 0..C-1 and -1
  (:func:`dbscan_max_distance`: the graph's cut-off that keeps all DBSCAN uses);
- :func:`cluster_centroids`: the normalised mean feature of each cluster;
- :func:`cluster_features`: a feature pool to pseudo labels in one call (graph cut at ``eps``,
  DBSCAN; :func:`camera_normalized` first when given the cameras);
- :func:`pseudo_label_quality`: NMI, ARI and pairwise precision / recall / F1.

This package knows only ``utils`` and the public functions of ``evaluation``.
"""

from .features import camera_normalized, cluster_features
from .graph import jaccard_distance_graph
from .labels import cluster_centroids, dbscan_max_distance, dbscan_pseudo_labels
from .quality import pseudo_label_quality

__all__ = ["jaccard_distance_graph", "dbscan_pseudo_labels", "dbscan_max_distance", "cluster_centroids", "pseudo_label_quality",
           "camera_normalized", "cluster_features"]
