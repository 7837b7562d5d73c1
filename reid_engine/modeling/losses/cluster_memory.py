"""Cluster contrast's memory (Dai et al.): one momentum-updated feature per pseudo-label cluster."""

import torch
import torch.nn.functional as F

from .memory import ResizableMemory, gather_batch, memory_similarity, momentum_update_

__all__ = ["ClusterMemory"]


class ClusterMemory(ResizableMemory):
    """A memory of cluster features and the contrastive loss of a batch against it (ClusterNCE).

    It is a memory of features, not a classifier: :meth:`reset` replaces it with the
    centroids at every re-clustering (the number of clusters changes), and no optimizer
    touches it. The loss of a batch is the cross-entropy of its normalised features'
    similarities to every cluster, divided by ``temp``, with the pseudo label as the class.

    The memory rows of the batch's clusters are momentum-updated in backward (a custom
    autograd Function, as cluster contrast does): the gradient uses the memory the loss saw,
    and a forward that is never backpropagated changes nothing. With a process group the
    update uses the batch of every worker (gathered in rank order), so the memories of all
    workers stay identical; each worker's loss covers its own samples.

    Args:
        num_features: D, the feature size.
        temp: the softmax temperature (cluster contrast: 0.05).
        momentum: m in ``memory = normalise(m * memory + (1 - m) * f)`` (cluster contrast: 0.1).
        mode: "mean", cluster contrast's centroid memory (every sample updates its cluster's
            row, one after the other in batch order), or "hard", its hardest-instance variant
            (per cluster in the batch, only the sample least similar to the cluster's row).
    """

    RESIZABLE = ("features",)
    MODES = ("mean", "hard")

    def __init__(self, num_features: int, temp: float = 0.05, momentum: float = 0.1, mode: str = "mean"):
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"ClusterMemory mode must be one of {self.MODES}, got {mode!r}")
        if not 0.0 <= momentum <= 1.0 or temp <= 0:
            raise ValueError(f"ClusterMemory needs 0 <= momentum <= 1 and temp > 0, got {momentum}, {temp}")
        self.num_features, self.temp, self.momentum, self.mode = num_features, temp, momentum, mode
        self.register_buffer("features", torch.zeros(0, num_features))

    @property
    def num_clusters(self) -> int:
        """C, the number of rows of the memory."""
        return self.features.shape[0]

    @torch.no_grad()
    def reset(self, centroids: torch.Tensor) -> None:
        """Replace the memory with (C, D) ``centroids`` (normalised, moved to the memory's device)."""
        if centroids.dim() != 2 or centroids.shape[1] != self.num_features:
            raise ValueError(f"ClusterMemory.reset needs (C, {self.num_features}) centroids, got {tuple(centroids.shape)}")
        self.features = F.normalize(centroids.detach().float(), dim=1).to(self.features.device)

    def forward(self, features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The ClusterNCE loss of a batch; its rows of the memory are updated in backward.

        Args:
            features: (B, D) features (normalised here).
            targets: (B,) pseudo labels 0..C-1.
        Returns:
            The scalar loss.
        """
        if self.num_clusters == 0:
            raise RuntimeError("ClusterMemory is empty: call reset(centroids) after each clustering")
        if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= self.num_clusters):
            raise ValueError(f"ClusterMemory: pseudo labels must be in 0..{self.num_clusters - 1} "
                             f"(outliers dropped), got {int(targets.min())}..{int(targets.max())}")
        inputs = F.normalize(features, dim=1)
        all_inputs, all_targets = gather_batch(inputs, targets)
        logits = memory_similarity(inputs, self.features, lambda: self._update(all_inputs, all_targets))
        return F.cross_entropy(logits / self.temp, targets)

    @torch.no_grad()
    def _update(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """The momentum update of the rows of ``targets`` by the (gathered) batch."""
        if self.mode == "mean":
            momentum_update_(self.features, targets, inputs, self.momentum)
            return
        clusters, slot = torch.unique(targets, return_inverse=True)
        sims = (inputs.to(self.features.dtype) * self.features[targets]).sum(1)
        # The least similar sample of each cluster: the smallest similarity per slot.
        hardest = torch.full((clusters.numel(),), float("inf"), device=sims.device).scatter_reduce(
            0, slot, sims, reduce="amin")
        pick = torch.nonzero(sims == hardest[slot]).flatten()
        first = torch.full((clusters.numel(),), targets.numel(), device=sims.device, dtype=torch.int64)
        first = first.scatter_reduce(0, slot[pick], pick, reduce="amin")  # the first sample on ties
        momentum_update_(self.features, clusters, inputs[first], self.momentum)

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, clusters={self.num_clusters}, temp={self.temp}, " \
               f"momentum={self.momentum}, mode={self.mode!r}"
