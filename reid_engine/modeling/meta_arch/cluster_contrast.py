"""ClusterContrast: backbone + head embedding trained against a memory of cluster centroids.

The label-free architecture (cluster contrast, Dai et al.; camera-aware proxies, CAP). It is
trained on pseudo labels (PSEUDO.ENABLED): the pseudo-label hook resets its memories from
every clustering through :meth:`ClusterContrast.reset_memory`. The memories are buffers, so
checkpoints hold them and a resumed run continues with the same centroids.
"""
from typing import Dict, Optional

import torch
from torch.nn import functional as F

from reid_engine.config import ConfigError
from reid_engine.utils.registry import check_choice

from ..losses.camera_proxy import CameraProxyMemory
from ..losses.cluster_memory import ClusterMemory
from .baseline import Baseline
from .build import META_ARCH_REGISTRY
from .moco import training_feature_dim

__all__ = ["ClusterContrast", "MEMORY_MODES", "check_label_free_architecture"]

#: PSEUDO.MEMORY.MODE values
MEMORY_MODES = ("mean", "hard")


@META_ARCH_REGISTRY.register()
class ClusterContrast(Baseline):
    """Baseline whose training feature (MODEL.HEADS.NECK_FEAT) is contrasted with a
    :class:`ClusterMemory` of the current clusters (``loss_cluster``), and optionally with
    per-camera proxies (``loss_intra_camera``, ``loss_inter_camera``, times their weight).

    The head's classifier is not used: it is built with one class and frozen, so the model
    stays light and DDP sees no parameter without a gradient.

    Args:
        memory: the cluster memory.
        camera_memory: the camera-proxy memory, or None.
        camera_weight: weight of the two camera-proxy losses.
        others: as :class:`Baseline` (``loss_fn`` is not used).
    """

    EAGER_ONLY_REASON = ("its memories change size at every re-clustering (a new graph each time) and are "
                         "updated in place in the backward pass")

    def __init__(self, *, memory: ClusterMemory, camera_memory: Optional[CameraProxyMemory] = None,
                 camera_weight: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.memory = memory
        self.camera_memory = camera_memory
        self.camera_weight = float(camera_weight)
        for param in self.heads.parameters(recurse=False):  # the classifier's class centres
            param.requires_grad_(False)

    @staticmethod
    def check_config(cfg) -> None:
        """Baseline's checks plus PSEUDO.ENABLED (the memory is filled by clustering)."""
        Baseline.check_config(cfg)
        if not cfg.PSEUDO.ENABLED:
            raise ConfigError("MODEL.META_ARCHITECTURE ClusterContrast trains on pseudo labels: set PSEUDO.ENABLED "
                              "True (see docs/label_free.md)")
        check_choice(cfg.PSEUDO.MEMORY.MODE, MEMORY_MODES, "PSEUDO.MEMORY.MODE")

    @classmethod
    def from_config(cls, cfg) -> "ClusterContrast":
        """Backbone and head as Baseline (with a single, unused class), the memories from PSEUDO.*."""
        cfg = cfg.clone()
        cfg.defrost()
        cfg.MODEL.HEADS.NUM_CLASSES = 1
        base = Baseline.from_config(cfg)
        dim = training_feature_dim(base.heads)
        mem, cam = cfg.PSEUDO.MEMORY, cfg.PSEUDO.CAMERA_PROXY
        camera_memory = (CameraProxyMemory(dim, temp=cam.TEMP, momentum=cam.MOMENTUM, hard_negatives=cam.HARD_NEGATIVES)
                         if cam.ENABLED else None)
        return cls(backbone=base.backbone, heads=base.heads, pixel_mean=list(cfg.MODEL.PIXEL_MEAN),
                   pixel_std=list(cfg.MODEL.PIXEL_STD), loss_fn=base.loss_fn,
                   memory=ClusterMemory(dim, temp=mem.TEMP, momentum=mem.MOMENTUM, mode=mem.MODE),
                   camera_memory=camera_memory, camera_weight=cam.WEIGHT)

    @torch.no_grad()
    def reset_memory(self, centroids: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
                     camids: torch.Tensor) -> None:
        """Start a clustering round: the cluster memory from the centroids, the camera proxies
        from the features of the clustered images.

        Args:
            centroids: (C, D) normalised cluster means.
            features: (M, D) features of the clustered images (outliers left out).
            labels: (M,) their clusters 0..C-1.
            camids: (M,) their cameras.
        """
        self.memory.reset(centroids.to(self.device))
        if self.camera_memory is not None:
            self.camera_memory.reset(features, labels.cpu().numpy(), camids.cpu().numpy())

    def memory_state(self) -> Dict[str, torch.Tensor]:
        """The memories' buffers (their sizes follow the clusters), for the pseudo-label hook's state."""
        return {k: v.detach().clone() for k, v in self.state_dict().items() if k.startswith(("memory.", "camera_memory."))}

    def load_memory_state(self, state: Dict[str, torch.Tensor]) -> None:
        """Restore :meth:`memory_state`, whatever the current sizes of the buffers (a model loader
        skips a buffer whose size differs from the freshly built, still empty memory)."""
        for key, value in state.items():
            module_name, _, name = key.rpartition(".")
            setattr(self.get_submodule(module_name), name, value.to(self.device).clone())

    def forward(self, batch):
        """Training: {"loss_cluster"[, "loss_intra_camera", "loss_inter_camera"]}; eval: features (B, D).

        Args:
            batch: {"images", "targets" (pseudo labels), "camids"}, or an image tensor (eval).
        """
        features = self.run_backbone(self.backbone, batch)
        if not self.training:
            return self.heads(features)
        targets = self.training_targets(batch, self.loss_fn)
        if self.memory.features.shape[0] == 0:
            raise ConfigError("ClusterContrast's cluster memory is empty: it is filled by the pseudo-label hook, so "
                              "train it with PSEUDO.ENABLED True through DefaultTrainer")
        # The head in training mode (BN neck on batch statistics); its one-class logits are unused.
        embedded = self.heads(features, torch.zeros_like(targets))["features"]
        return self.memory_losses(F.normalize(embedded.float(), dim=1), targets, self.batch_camids(batch))

    def memory_losses(self, features: torch.Tensor, targets: torch.Tensor,
                      camids: Optional[torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The contrastive losses of normalised features against the memories (which they update)."""
        losses = {"loss_cluster": self.memory(features, targets)}
        if self.camera_memory is not None:
            for name, value in self.camera_memory(features, targets, camids).items():
                losses[name] = value * self.camera_weight
        return losses


def check_label_free_architecture(cfg) -> None:
    """With PSEUDO.ENABLED, MODEL.META_ARCHITECTURE must be ClusterContrast: the clustering fills its
    memory. (The converse, ClusterContrast without PSEUDO.ENABLED, is :meth:`ClusterContrast.check_config`.)

    Raises:
        ConfigError: another architecture, as one line naming the fix.
    """
    if cfg.PSEUDO.ENABLED and cfg.MODEL.META_ARCHITECTURE != ClusterContrast.__name__:
        raise ConfigError(f"PSEUDO.ENABLED trains a cluster memory, which MODEL.META_ARCHITECTURE "
                          f"{cfg.MODEL.META_ARCHITECTURE} has not; set it to ClusterContrast")
