"""Camera-aware proxies (CAP, Wang et al., AAAI 2021): one memory feature per (cluster, camera)."""

from typing import Dict

import numpy as np
import torch
import torch.nn.functional as F

from .memory import ResizableMemory, gather_batch, memory_similarity, momentum_update_

__all__ = ["CameraProxyMemory"]


class CameraProxyMemory(ResizableMemory):
    """Per-camera sub-cluster proxies and CAP's intra- and inter-camera contrastive losses.

    A cluster seen by several cameras gets one proxy per camera (the normalised mean of its
    features in that camera), so the camera's style does not pull a cluster apart. For a
    sample of cluster y seen by camera c (similarities divided by ``temp``):

    - ``loss_intra_camera``: cross-entropy over the proxies of camera c, the positive
      being the proxy (y, c);
    - ``loss_inter_camera``: the positives are all proxies of cluster y (every camera),
      weighted equally; the negatives are the ``hard_negatives`` proxies of other
      clusters most similar to the sample: ``-mean_p log(exp(s_p) / sum_{positives and
      hard negatives} exp(s))``.

    Both are averaged over the batch. The proxies (y, c) of the batch are momentum-updated in
    backward (as in :class:`ClusterMemory`, gathered across workers).

    Args:
        num_features: D, the feature size.
        temp: the softmax temperature (CAP: 0.07).
        momentum: the weight of the old proxy (CAP: 0.2).
        hard_negatives: the number of hardest other-cluster proxies in the inter-camera loss (CAP: 50).
    """

    RESIZABLE = ("proxies", "proxy_label", "proxy_camera")

    def __init__(self, num_features: int, temp: float = 0.07, momentum: float = 0.2, hard_negatives: int = 50):
        super().__init__()
        if not 0.0 <= momentum <= 1.0 or temp <= 0 or hard_negatives < 1:
            raise ValueError(f"CameraProxyMemory needs 0 <= momentum <= 1, temp > 0 and hard_negatives >= 1, "
                             f"got {momentum}, {temp}, {hard_negatives}")
        self.num_features, self.temp, self.momentum, self.hard_negatives = num_features, temp, momentum, hard_negatives
        self.register_buffer("proxies", torch.zeros(0, num_features))
        self.register_buffer("proxy_label", torch.zeros(0, dtype=torch.int64))
        self.register_buffer("proxy_camera", torch.zeros(0, dtype=torch.int64))

    @property
    def num_proxies(self) -> int:
        """P, the number of (cluster, camera) proxies."""
        return self.proxies.shape[0]

    @torch.no_grad()
    def reset(self, features: torch.Tensor, labels: np.ndarray, camids: np.ndarray) -> None:
        """Build the proxies: the normalised mean feature of every (cluster, camera) pair, outliers skipped.

        Args:
            features: (N, D) features of the clustered set.
            labels: (N,) pseudo labels, -1 = outlier.
            camids: (N,) camera ids (any non-negative integers).
        """
        device = self.proxies.device
        labels_t = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        cams_t = torch.as_tensor(np.asarray(camids), dtype=torch.int64)
        if features.dim() != 2 or features.shape[1] != self.num_features or not \
                labels_t.shape == cams_t.shape == features.shape[:1]:
            raise ValueError(f"CameraProxyMemory.reset needs (N, {self.num_features}) features with N labels and "
                             f"N camera ids, got {tuple(features.shape)}, {labels_t.numel()}, {cams_t.numel()}")
        keep = labels_t >= 0
        pairs, slot = torch.unique(torch.stack([labels_t[keep], cams_t[keep]], 1), dim=0, return_inverse=True)
        sums = torch.zeros(pairs.shape[0], self.num_features)
        sums.index_add_(0, slot, features.detach().float().cpu()[keep])
        self.proxies = F.normalize(sums, dim=1).to(device)
        self.proxy_label, self.proxy_camera = pairs[:, 0].to(device), pairs[:, 1].to(device)

    def _proxy_index(self, targets: torch.Tensor, camids: torch.Tensor) -> torch.Tensor:
        """The index of the proxy (target, camera) of each sample (proxies are sorted by label, then camera)."""
        span = int(self.proxy_camera.max()) + 1
        keys = self.proxy_label * span + self.proxy_camera
        wanted = targets * span + camids
        index = torch.searchsorted(keys, wanted).clamp_max(keys.numel() - 1)
        missing = (keys[index] != wanted) | (camids >= span) | (camids < 0)
        if bool(missing.any()):
            i = int(missing.nonzero()[0])
            raise ValueError(f"CameraProxyMemory has no proxy for cluster {int(targets[i])} in camera {int(camids[i])}: "
                             f"call reset() with the features, pseudo labels and cameras the batches come from")
        return index

    def forward(self, features: torch.Tensor, targets: torch.Tensor, camids: torch.Tensor) -> Dict[str, torch.Tensor]:
        """CAP's two losses for a batch; its proxies are updated in backward.

        Args:
            features: (B, D) features (normalised here).
            targets: (B,) pseudo labels.
            camids: (B,) camera ids.
        Returns:
            ``{"loss_intra_camera": scalar, "loss_inter_camera": scalar}``.
        """
        if self.num_proxies == 0:
            raise RuntimeError("CameraProxyMemory is empty: call reset(features, labels, camids) after each clustering")
        targets, camids = targets.to(self.proxy_label.device), camids.to(self.proxy_label.device)
        rows = self._proxy_index(targets, camids)
        inputs = F.normalize(features, dim=1)
        all_inputs, all_rows = gather_batch(inputs, rows)
        logits = memory_similarity(inputs, self.proxies,
                                   lambda: momentum_update_(self.proxies, all_rows, all_inputs, self.momentum)) / self.temp
        # Intra-camera: softmax over the proxies of the sample's own camera.
        other_camera = self.proxy_camera.unsqueeze(0) != camids.unsqueeze(1)
        intra = F.cross_entropy(logits.masked_fill(other_camera, float("-inf")), rows)
        # Inter-camera: all proxies of the cluster against the hardest proxies of other clusters.
        positive = self.proxy_label.unsqueeze(0) == targets.unsqueeze(1)
        k = min(self.hard_negatives, self.num_proxies)
        hard = logits.masked_fill(positive, float("-inf")).topk(k, dim=1).values
        pos_logits = logits.masked_fill(~positive, float("-inf"))
        log_norm = torch.logsumexp(torch.cat([pos_logits, hard], 1), dim=1, keepdim=True)
        log_prob = (logits - log_norm).masked_fill(~positive, 0.0)
        inter = (-log_prob.sum(1) / positive.sum(1)).mean()
        return {"loss_intra_camera": intra, "loss_inter_camera": inter}

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, proxies={self.num_proxies}, temp={self.temp}, " \
               f"momentum={self.momentum}, hard_negatives={self.hard_negatives}"
