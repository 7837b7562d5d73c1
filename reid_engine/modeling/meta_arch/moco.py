"""MoCo: Baseline plus a memory queue of past features and a pairwise CosFace loss against it."""
from typing import Dict

import torch
from torch import nn
from torch.nn import functional as F

from reid_engine.config import ConfigError
from reid_engine.utils import comm

from ..losses.distributed import gather_with_local_grad
from ..losses.pairwise import masked_logsumexp
from .baseline import Baseline
from .build import META_ARCH_REGISTRY

__all__ = ["MoCo", "FeatureQueue", "memory_cosface_loss", "check_queue_size"]

# fast-reid's fixed memory-loss hyper-parameters (no config keys).
MEMORY_MARGIN = 0.25
MEMORY_GAMMA = 32.0


def check_queue_size(queue_size: int, global_batch: int) -> None:
    """Raise a one-line ConfigError unless MODEL.QUEUE_SIZE is a positive multiple of the
    global batch SOLVER.IMS_PER_BATCH (every step writes one global batch into the queue,
    and a write never wraps around its end)."""
    if queue_size < 1 or global_batch < 1 or queue_size % global_batch:
        suggestion = max(1, round(queue_size / max(global_batch, 1))) * global_batch
        raise ConfigError(f"MODEL.QUEUE_SIZE ({queue_size}) must be a positive multiple of SOLVER.IMS_PER_BATCH "
                          f"({global_batch}), the features every step enqueues; set it to e.g. {suggestion}")


def memory_cosface_loss(features: torch.Tensor, targets: torch.Tensor, memory: torch.Tensor,
                        memory_labels: torch.Tensor, self_columns: torch.Tensor,
                        margin: float = MEMORY_MARGIN, gamma: float = MEMORY_GAMMA) -> torch.Tensor:
    """Pairwise CosFace of a batch against a memory of features.

    Per anchor ``softplus(LSE_p(-gamma * s_p) + LSE_n(gamma * (s_n + m)))`` over the cosine
    similarities ``s`` to the memory entries of the same label (positives, the anchor's own
    copy excluded) and of other labels (negatives); anchors without positives add 0.

    Args:
        features: (B, D) L2-normalised features.
        targets: (B,) labels.
        memory: (D, M) L2-normalised features, one per column.
        memory_labels: (M,) labels of the columns.
        self_columns: (B,) column holding each anchor's own copy.
        margin, gamma: CosFace margin and scale.

    Returns:
        Tensor: scalar loss (mean over anchors).
    """
    sim = features @ memory
    is_pos = targets.view(-1, 1) == memory_labels.view(1, -1)
    is_neg = ~is_pos
    rows = torch.arange(features.shape[0], device=features.device)
    is_pos[rows, self_columns] = False
    return F.softplus(masked_logsumexp(-gamma * sim, is_pos) + masked_logsumexp(gamma * (sim + margin), is_neg)).mean()


class FeatureQueue(nn.Module):
    """Ring buffer of L2-normalised features and their labels, written with every worker's batch.

    Buffers (fast-reid's names, so its MoCo checkpoints load, and part of the state dict so
    a resumed run continues with the same queue): ``queue`` (dim, size), one feature per
    column, starting as random unit vectors; ``queue_label`` (1, size), starting at 0;
    ``queue_ptr`` (1,), the column the next write starts at.

    Args:
        dim: feature width.
        size: number of entries.
    """

    def __init__(self, dim: int, size: int):
        super().__init__()
        self.size = int(size)
        self.register_buffer("queue", F.normalize(torch.randn(dim, self.size), dim=0))
        self.register_buffer("queue_label", torch.zeros(1, self.size, dtype=torch.long))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Write every worker's features and labels (rank order) at the pointer and advance it.

        The pointer stays a tensor and the write is an index_copy_, so under torch.compile no
        Python number of the position reaches the graph (no graph break, no guard that
        recompiles when the position moves); the queue's own storage receives copies, so
        nothing it holds aliases a (CUDA-graph) output of the step.

        Args:
            features: (B, D) L2-normalised features of this worker (same B on every worker).
            labels: (B,) their labels.

        Returns:
            (B,) the columns where this worker's features were written.
        """
        features = gather_with_local_grad(features.detach().to(self.queue.dtype))
        labels = gather_with_local_grad(labels.detach().to(self.queue_label.dtype))
        batch = features.shape[0]
        if self.size % batch:
            raise ValueError(f"the queue holds {self.size} features, not a multiple of the {batch} enqueued per "
                             "step; set MODEL.QUEUE_SIZE to a multiple of SOLVER.IMS_PER_BATCH")
        columns = self.queue_ptr + torch.arange(batch, device=self.queue_ptr.device)
        self.queue.index_copy_(1, columns, features.t())
        self.queue_label.index_copy_(1, columns, labels.view(1, -1))
        self.queue_ptr.copy_((self.queue_ptr + batch) % self.size)
        local = batch // comm.get_world_size()
        return columns[comm.get_rank() * local:(comm.get_rank() + 1) * local]

    def forward(self, features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Enqueue the batch, then return its CosFace loss against the whole queue (the fresh
        entries included, each anchor's own copy excluded).

        Args:
            features: (B, D) features (normalised here).
            targets: (B,) labels.
        """
        features = F.normalize(features.float(), dim=1)
        self_columns = self.enqueue(features, targets)
        return memory_cosface_loss(features, targets, self.queue, self.queue_label[0], self_columns)


def training_feature_dim(heads: nn.Module) -> int:
    """Width of the head's training "features" output (MODEL.HEADS.NECK_FEAT)."""
    return heads.feat_dim if heads.neck_feat == "after" else heads.in_feat_dim


@META_ARCH_REGISTRY.register()
class MoCo(Baseline):
    """Baseline whose training features also fill a memory queue (``memory``, a
    :class:`FeatureQueue` of MODEL.QUEUE_SIZE entries) and are compared with it by a
    pairwise CosFace loss (``loss_mb``, margin 0.25, scale 32, weight 1), as fast-reid's MoCo.

    Args:
        queue_size: entries of the queue; other arguments as Baseline.
    """

    def __init__(self, *, queue_size: int, **kwargs):
        super().__init__(**kwargs)
        self.memory = FeatureQueue(training_feature_dim(self.heads), queue_size)

    @staticmethod
    def check_config(cfg) -> None:
        """Baseline's checks plus MODEL.QUEUE_SIZE against the global batch SOLVER.IMS_PER_BATCH."""
        Baseline.check_config(cfg)
        check_queue_size(cfg.MODEL.QUEUE_SIZE, cfg.SOLVER.IMS_PER_BATCH)

    @classmethod
    def from_config(cls, cfg) -> "MoCo":
        """Baseline's parts plus the queue (MODEL.QUEUE_SIZE, checked against SOLVER.IMS_PER_BATCH)."""
        check_queue_size(cfg.MODEL.QUEUE_SIZE, cfg.SOLVER.IMS_PER_BATCH)
        base = Baseline.from_config(cfg)
        return cls(backbone=base.backbone, heads=base.heads, pixel_mean=list(cfg.MODEL.PIXEL_MEAN),
                   pixel_std=list(cfg.MODEL.PIXEL_STD), loss_fn=base.loss_fn, queue_size=cfg.MODEL.QUEUE_SIZE)

    def losses(self, outputs: Dict[str, torch.Tensor], targets: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Baseline's losses plus ``loss_mb``, the memory loss of the training features."""
        losses = super().losses(outputs, targets)
        losses["loss_mb"] = self.memory(outputs["features"], targets)
        return losses
