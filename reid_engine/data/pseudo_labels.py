"""The training loader of label-free training: the target sets' identities come from clustering.

The loader is built over every training set of ``DATASETS.NAMES``. The sets named in
``PSEUDO.TARGETS`` (all of them when it is empty) are *targets*: their ground-truth identities
never enter the training path. Each target image starts as an identity of its own (a
placeholder), and every re-clustering hands the loader new labels (:meth:`PseudoLabelTrainLoader.set_labels`),
which rebuild its dataset and P x K sampler over the clusters and start a new stream. The
ground truth is kept aside, only for the pseudo-label quality measured after clustering.
"""

import logging
from typing import List, Sequence

import numpy as np

from reid_engine.config import ConfigError
from reid_engine.runtime.run_plan import loader_workers
from reid_engine.utils import comm
from reid_engine.utils.registry import check_choice

from .build import TrainLoader
from .collate import TrainCollator
from .common import BAD_IMAGE_POLICIES, TrainImageSet
from .datasets import DatasetFormatError, get_dataset, is_video_dataset, merge_train_sets, resolve_data_root
from .image_cache import build_image_cache
from .samplers import SAMPLER_REGISTRY
from .train_sampling import build_train_sampler, per_worker_batch
from .transforms import build_transforms

__all__ = ["PseudoLabelTrainLoader", "build_pseudo_train_loader", "check_pseudo_loader_config", "pseudo_target_names",
           "relabel_with_clusters"]

logger = logging.getLogger(__name__)


def pseudo_target_names(cfg) -> List[str]:
    """The training sets trained on pseudo labels: PSEUDO.TARGETS, or every set of DATASETS.NAMES.

    Raises:
        ConfigError: a target that is not one of DATASETS.NAMES (one line naming it).
    """
    names = list(cfg.DATASETS.NAMES)
    targets = list(cfg.PSEUDO.TARGETS) or names
    unknown = [t for t in targets if t not in names]
    if unknown:
        raise ConfigError(f"PSEUDO.TARGETS {unknown} are not training sets of DATASETS.NAMES {names}; add them to "
                          "DATASETS.NAMES (their labels stay hidden) or remove them from PSEUDO.TARGETS")
    return targets


def check_pseudo_loader_config(cfg) -> None:
    """With PSEUDO.ENABLED, check what the label-free loader needs: PSEUDO.TARGETS names training
    sets, and DATALOADER.SAMPLER_TRAIN is a P x K identity sampler (it samples the clusters).

    Raises:
        ConfigError / UnknownChoiceError: the first wrong value, as one line naming the key.
    """
    if not cfg.PSEUDO.ENABLED:
        return
    pseudo_target_names(cfg)
    if "num_instances" not in SAMPLER_REGISTRY.get(cfg.DATALOADER.SAMPLER_TRAIN).extra_args:
        raise ConfigError(f"PSEUDO.ENABLED needs a P x K identity sampler over the clusters, not "
                          f"DATALOADER.SAMPLER_TRAIN {cfg.DATALOADER.SAMPLER_TRAIN}; use NaiveIdentitySampler "
                          "(or DomainBalancedSampler for joint training)")


def _round_seed(base_seed: int, round_index: int) -> int:
    """The sampler seed of clustering round ``round_index`` (-1: the placeholder stream)."""
    return int(np.random.default_rng([base_seed, round_index + 1, 7]).integers(2 ** 31))


class PseudoLabelTrainLoader(TrainLoader):
    """A :class:`TrainLoader` whose identities are replaced at every re-clustering.

    Attributes:
        all_items: every training item ``(path, label, camid)`` in DATASETS.NAMES order; a
            target item's label is a placeholder (its own index, offset past the source ids).
        domains: (N,) training set index of every item.
        is_target: (N,) bool, the item belongs to a pseudo-labelled set.
        num_source_classes: identities of the labelled (non-target) sets, labels 0..S-1.
        round: the clustering round of the current stream (-1: none yet).

    Args:
        cfg: the config (sampler, DATALOADER.*, SOLVER.IMS_PER_BATCH).
        all_items, domains, is_target, num_source_classes: as the attributes.
        hidden_truth: (N,) ground-truth ids of the items (read only by :meth:`target_truth`).
        num_cameras: cameras over all training sets.
        pipeline: the training augmentation pipeline.
        batch_size: images per batch on this rank.
        base_seed: the stream seed; each round's sampler seed is derived from it.
        domain_names: DATASETS.NAMES.
        num_workers: loader worker processes.
        hang_timeout: DATALOADER.HANG_TIMEOUT (see TrainLoader).
    """

    def __init__(self, cfg, all_items: Sequence, domains: np.ndarray, is_target: np.ndarray,
                 num_source_classes: int, hidden_truth: np.ndarray, num_cameras: int, pipeline,
                 batch_size: int, base_seed: int, domain_names: Sequence[str], num_workers: int = 0,
                 hang_timeout: float = 0.0):
        self.cfg = cfg
        self.all_items = list(all_items)
        self.domains = np.asarray(domains, dtype=np.int64)
        self.is_target = np.asarray(is_target, dtype=bool)
        self.num_source_classes = int(num_source_classes)
        self._hidden_truth = np.asarray(hidden_truth, dtype=np.int64)
        self.num_cameras = int(num_cameras)
        self.pipeline = pipeline
        self.base_seed = int(base_seed)
        self.domain_names = list(domain_names)
        self.round = -1
        # One cache for every re-clustering: the images stay the same, only their labels change.
        self.cache = build_image_cache(cfg, [path for path, _, _ in self.all_items], pipeline)
        placeholder = np.array([label for _, label, _ in self.all_items], dtype=np.int64)
        dataset, sampler = self._build(placeholder, _round_seed(self.base_seed, -1), int(batch_size))
        super().__init__(dataset, sampler, batch_size, TrainCollator(pipeline), num_workers=num_workers,
                         hang_timeout=hang_timeout)

    def _build(self, labels: np.ndarray, seed: int, batch_size: int):
        keep = labels >= 0
        items = [(path, int(label), camid) for (path, _, camid), label, kept
                 in zip(self.all_items, labels.tolist(), keep.tolist()) if kept]
        domains = self.domains[keep]
        dataset = TrainImageSet(items, self.pipeline, int(labels.max()) + 1, self.num_cameras, domains=domains,
                                domain_names=self.domain_names, on_bad_image=self.cfg.DATALOADER.ON_BAD_IMAGE,
                                cache=self.cache)
        return dataset, build_train_sampler(self.cfg, items, domains, batch_size, seed)

    def set_labels(self, labels: np.ndarray, round_index: int) -> None:
        """Train on ``labels`` from now on: a new dataset, sampler and stream (at its batch 0).

        Args:
            labels: (N,) int label of every item of ``all_items``; -1 leaves the item out
                (a DBSCAN outlier). Source items keep their own labels 0..S-1.
            round_index: the clustering round (seeds the new sampler).
        """
        labels = np.asarray(labels, dtype=np.int64)
        if labels.shape != (len(self.all_items),):
            raise ValueError(f"set_labels: {labels.shape} labels for {len(self.all_items)} training items")
        self.close()
        self.dataset, self.sampler = self._build(labels, _round_seed(self.base_seed, round_index), self.batch_size)
        self.round = int(round_index)
        self._num_batches = 0

    def target_truth(self) -> np.ndarray:
        """Ground-truth ids of the target items (in ``all_items`` order): for measuring the
        pseudo-label quality after clustering only, never for training."""
        return self._hidden_truth[self.is_target]


def build_pseudo_train_loader(cfg) -> PseudoLabelTrainLoader:
    """Build the label-free training loader over DATASETS.NAMES (PSEUDO.TARGETS hidden).

    Until the first clustering each target image is its own identity; the pseudo-label hook
    sets the clusters before the first batch is drawn.

    Args:
        cfg: the config.
    Returns:
        a :class:`PseudoLabelTrainLoader`.
    Raises:
        ConfigError: a video set, or a target not in DATASETS.NAMES.
    """
    root = resolve_data_root(cfg.DATASETS.ROOT)
    names = list(cfg.DATASETS.NAMES)
    if not names:
        raise ConfigError("DATASETS.NAMES is empty; name the training set(s) to pseudo-label in it")
    targets = set(pseudo_target_names(cfg))
    datasets = [get_dataset(name, root, combineall=cfg.DATASETS.COMBINEALL, split_id=cfg.DATASETS.SPLIT_ID)
                for name in names]
    if any(is_video_dataset(ds) for ds in datasets):
        raise ConfigError("PSEUDO.ENABLED trains on image datasets only; remove the video sets from DATASETS.NAMES")
    sources = [ds for name, ds in zip(names, datasets) if name not in targets]
    items, _, num_cameras = merge_train_sets(datasets)
    if not items:
        raise DatasetFormatError(f"the training split of {names} is empty; check the dataset folders under '{root}'")
    domains = np.repeat(np.arange(len(datasets)), [len(ds.train) for ds in datasets])
    is_target = np.isin(domains, [d for d, name in enumerate(names) if name in targets])
    truth = np.array([pid for _, pid, _ in items], dtype=np.int64)
    # Source ids become 0..S-1 (merge_train_sets numbers every set, targets included); each target
    # image gets a placeholder id of its own, so its ground truth never reaches the training path.
    labels = np.empty(len(items), dtype=np.int64)
    source = ~is_target
    labels[source] = np.unique(truth[source], return_inverse=True)[1]
    num_source = int(labels[source].max()) + 1 if source.any() else 0
    labels[is_target] = num_source + np.arange(int(is_target.sum()))
    hidden = [(path, label, camid) for (path, _, camid), label in zip(items, labels.tolist())]
    batch_size = per_worker_batch(cfg.SOLVER.IMS_PER_BATCH, comm.get_world_size(), "SOLVER.IMS_PER_BATCH")
    seed = int(cfg.SEED) if cfg.SEED >= 0 else comm.shared_random_seed()
    check_choice(cfg.DATALOADER.ON_BAD_IMAGE, BAD_IMAGE_POLICIES, "DATALOADER.ON_BAD_IMAGE")
    logger.info("Label-free train loader: %d images of %s trained on pseudo labels (their labels hidden)%s; "
                "%s, %d images per batch per worker, stream seed %d", int(is_target.sum()), ", ".join(sorted(targets)),
                f", {len(items) - int(is_target.sum())} labelled images ({num_source} ids) of "
                f"{', '.join(ds.name for ds in sources)}" if sources else "", cfg.DATALOADER.SAMPLER_TRAIN,
                batch_size, seed)
    return PseudoLabelTrainLoader(cfg, hidden, domains, is_target, num_source, truth, num_cameras,
                                  build_transforms(cfg, is_train=True), batch_size, seed, names,
                                  num_workers=loader_workers(cfg), hang_timeout=cfg.DATALOADER.HANG_TIMEOUT)


def relabel_with_clusters(loader: PseudoLabelTrainLoader, cluster_labels: np.ndarray) -> np.ndarray:
    """The label of every training item, given the clusters of the target items.

    Args:
        loader: the label-free loader.
        cluster_labels: (T,) cluster of every target item (-1 = outlier), contiguous 0..C-1.
    Returns:
        (N,) labels: sources keep 0..S-1, targets become S + cluster, outliers -1.
    """
    labels = np.array([label for _, label, _ in loader.all_items], dtype=np.int64)
    cluster_labels = np.asarray(cluster_labels, dtype=np.int64)
    labels[loader.is_target] = np.where(cluster_labels >= 0, cluster_labels + loader.num_source_classes, -1)
    return labels
