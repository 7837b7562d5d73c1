"""ReID losses (one module per family) and the registry that builds them from MODEL.LOSSES."""
from .build import LOSS_REGISTRY, LossSet, ReidLoss, build_losses, registered_loss_names
from .camera_proxy import CameraProxyMemory
from .circle import pairwise_circle_loss
from .cluster_memory import ClusterMemory
from .cosface import pairwise_cosface_loss
from .cross_entropy import cross_entropy_loss
from .focal import focal_loss
from .triplet import hard_example_mining, triplet_loss, weighted_example_mining

__all__ = [
    "LOSS_REGISTRY", "LossSet", "ReidLoss", "build_losses", "registered_loss_names",
    "cross_entropy_loss", "focal_loss", "triplet_loss", "hard_example_mining",
    "weighted_example_mining", "pairwise_circle_loss", "pairwise_cosface_loss",
    "ClusterMemory", "CameraProxyMemory",
]
