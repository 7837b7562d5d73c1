"""The pseudo-label loop of label-free training, as a hook on the trainer.

At the start of every PSEUDO.PERIOD-th epoch (the first at iteration 0): embed every training
image through the evaluation's extraction loop (sharded over the workers, with progress lines),
compute the k-reciprocal Jaccard distances of the target images, cluster them with DBSCAN,
drop the outliers, reset the model's cluster memory from the centroids and rebuild the P x K
sampler over the clusters. The labels, their round and the clustering iteration are the hook's
state; with the memory (model buffers) and the loader's stream position they make a resumed
run continue exactly as an uninterrupted one.
"""
import logging
import time
from typing import Dict, Optional

import numpy as np
import torch

from ...clustering import cluster_centroids, cluster_features, pseudo_label_quality
from ...config import ConfigError
from ...data.pseudo_labels import PseudoLabelTrainLoader, relabel_with_clusters
from ...inference.extraction import extract_model_features, gather_features
from ...utils import comm
from ...utils.errors import ReidUserError
from ..train_loop import HookBase

__all__ = ["PseudoLabeler", "PseudoLabelError"]

logger = logging.getLogger(__name__)


class PseudoLabelError(ReidUserError, RuntimeError):
    """The clustering gave no usable training set (all outliers, too few clusters)."""


class PseudoLabeler(HookBase):
    """Re-cluster the target images at the start of every ``period`` iterations (PSEUDO.PERIOD
    epochs) and train on the clusters until the next time.

    Logs the clusters, outliers and time (and, where the target sets have ground truth, the
    pseudo-label quality: NMI, ARI, pairwise precision / recall / F1), and writes them to the
    event storage as ``pseudo/*`` scalars (metrics.json, tensorboard).

    Args:
        cfg: the config.
        loader: the trainer's :class:`PseudoLabelTrainLoader`.
        period: iterations between clusterings.
    """

    def __init__(self, cfg, loader: PseudoLabelTrainLoader, period: int):
        self.cfg = cfg
        self.loader = loader
        self.period = int(period)
        self.labels: Optional[np.ndarray] = None  # (N,) of the current round
        self.round = -1
        self.cluster_iter = -1  # the iteration of the last clustering

    def before_step(self) -> None:
        it = self.trainer.iter
        if it % self.period == 0 and it != self.cluster_iter:
            self.recluster(it)

    def _extract(self) -> Optional[np.ndarray]:
        """Features of every training item on the main worker (None elsewhere)."""
        cfg = self.cfg
        items = self.loader.all_items
        # The training image cache serves the test pipeline too when INPUT.SIZE_TEST equals SIZE_TRAIN.
        begin, shard = extract_model_features(cfg, self.trainer.model, items, flip=cfg.TEST.FLIP.ENABLED,
                                              what="Pseudo labels: extracting training features",
                                              cache=self.loader.cache)
        return gather_features(begin, shard, len(items))

    def _cluster(self, features: np.ndarray) -> np.ndarray:
        """Clusters of the target items (-1: outliers), from the features of every training item."""
        p = self.cfg.PSEUDO
        camids = np.array([camid for _, _, camid in self.loader.all_items])[self.loader.is_target]
        return cluster_features(features[self.loader.is_target], eps=p.EPS, min_samples=p.MIN_SAMPLES, k1=p.K1,
                                k2=p.K2, chunk_size=p.CHUNK_SIZE or None, camids=camids if p.CAMERA_NORM else None)

    def recluster(self, iteration: int) -> None:
        """Extract, cluster, reset the memory and the sampler (every worker takes part)."""
        start = time.perf_counter()
        round_index = self.round + 1
        features = self._extract()
        extract_time = time.perf_counter() - start
        payload = None
        if comm.is_main_process():
            payload = (relabel_with_clusters(self.loader, self._cluster(features)), features)
        labels, features = comm.all_gather(payload)[0]  # the main worker's result, on every worker
        stats = self._check(labels)
        self._apply(labels, torch.from_numpy(features), round_index)
        self.cluster_iter = iteration
        elapsed = time.perf_counter() - start
        stats.update(self._quality(labels))
        self._report(stats, round_index, iteration, extract_time, elapsed)

    def _check(self, labels: np.ndarray) -> Dict[str, float]:
        """Clusters and outliers of the targets; raise when they cannot fill a batch."""
        target = labels[self.loader.is_target]
        clusters = int(np.unique(target[target >= 0]).size)
        outliers = int((target < 0).sum())
        p = self.cfg.PSEUDO
        ids_per_batch = self.cfg.SOLVER.IMS_PER_BATCH // self.cfg.DATALOADER.NUM_INSTANCE
        usable = clusters + self.loader.num_source_classes
        if clusters == 0 or usable < ids_per_batch:
            what = "every target image is an outlier" if clusters == 0 else f"only {clusters} clusters were found"
            raise PseudoLabelError(
                f"DBSCAN pseudo labels: {what} ({outliers} of {target.size} outliers) but a batch needs "
                f"{ids_per_batch} identities (SOLVER.IMS_PER_BATCH / DATALOADER.NUM_INSTANCE); raise PSEUDO.EPS "
                f"(now {p.EPS}) or lower PSEUDO.MIN_SAMPLES (now {p.MIN_SAMPLES}), or lower SOLVER.IMS_PER_BATCH")
        return {"num_clusters": clusters, "num_outliers": outliers}

    def _apply(self, labels: np.ndarray, features: torch.Tensor, round_index: int) -> None:
        """Reset the memory and the loader's stream to the labels of round ``round_index``."""
        keep = labels >= 0
        kept_labels = torch.from_numpy(labels[keep])
        kept = features[torch.from_numpy(keep)]
        camids = torch.tensor([camid for (_, _, camid), k in zip(self.loader.all_items, keep.tolist()) if k])
        model = comm.unwrap_model(self.trainer.model)
        model.reset_memory(cluster_centroids(kept, kept_labels), kept, kept_labels, camids)
        self.loader.set_labels(labels, round_index)
        # The step trainer iterates the loader (or a device prefetcher over it, which reads a batch
        # ahead): it must start over on the new stream.
        self.trainer.restart_data_stream()
        self.labels, self.round = labels, round_index

    def _quality(self, labels: np.ndarray) -> Dict[str, float]:
        """Pseudo-label quality against the targets' ground truth, where the sets have one."""
        truth = self.loader.target_truth()
        if truth.size < 2 or np.unique(truth).size < 2 or (truth < 0).any():
            return {}
        pred = labels[self.loader.is_target]
        pred = np.where(pred >= 0, pred - self.loader.num_source_classes, -1)
        quality = pseudo_label_quality(pred, truth)
        return {k: v for k, v in quality.items() if k not in ("num_clusters", "num_outliers")}

    def _report(self, stats: Dict[str, float], round_index: int, iteration: int, extract_time: float,
                elapsed: float) -> None:
        num_targets = int(self.loader.is_target.sum())
        text = (f"Pseudo labels (round {round_index}, iteration {iteration}): {stats['num_clusters']} clusters, "
                f"{stats['num_outliers']} of {num_targets} target images outliers, in {elapsed:.1f} s "
                f"(extraction {extract_time:.1f} s)")
        quality = {k: v for k, v in stats.items() if k not in ("num_clusters", "num_outliers")}
        if quality:
            text += "; quality vs ground truth: " + ", ".join(f"{k} {v:.4f}" for k, v in quality.items())
        logger.info(text)
        scalars = {f"pseudo/{k}": float(v) for k, v in stats.items()}
        scalars["pseudo/time"] = elapsed
        self.trainer.storage.put_scalars(**scalars, smoothing_hint=False)

    def state_dict(self) -> dict:
        """The current round's labels (N,), the round, the clustering iteration and the model's memories
        (also in the model's state dict, but sized by the clusters, which a fresh model is not)."""
        if self.labels is None:
            return {}
        return {"labels": torch.from_numpy(self.labels), "round": self.round, "cluster_iter": self.cluster_iter,
                "memory": comm.unwrap_model(self.trainer.model).memory_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the round's labels (rebuilding the loader's dataset and sampler over them) and the
        model's memories; the stream position comes back with the loader's state."""
        labels = state_dict["labels"]
        labels = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
        if labels.shape != (len(self.loader.all_items),):
            raise ConfigError(f"the checkpoint's pseudo labels cover {labels.shape[0]} training images but this run "
                              f"has {len(self.loader.all_items)}; resume with the same DATASETS.NAMES")
        self.round = int(state_dict["round"])
        self.cluster_iter = int(state_dict["cluster_iter"])
        self.labels = labels.astype(np.int64)
        self.loader.set_labels(self.labels, self.round)
        comm.unwrap_model(self.trainer.model).load_memory_state(state_dict["memory"])
