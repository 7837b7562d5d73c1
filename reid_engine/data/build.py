"""Train / test loader builders: the config checks of the data section, the resumable training
loader and the evaluation / extraction loaders.

The path of a training batch: the sampler (main process) yields indices; a batch sampler tags
each with ``(stream seed, 0, global position)`` (``train_sampling``); a worker decodes and augments
every sample with a generator seeded from that tag; the collate stacks the batch and applies batch
ops with a generator seeded from the first tag (``collate``). Nothing random depends on the worker
process, so the stream is the same for any ``DATALOADER.NUM_WORKERS`` and can be resumed at any
batch. The device prefetcher is in ``prefetcher``; this module re-exports the names of all three.
Every loader reads under the hang watchdog (DATALOADER.HANG_TIMEOUT): ``loader_watchdog`` for the
training loader's workers, the read deadline of ``reliability.read_deadline`` for a training loader
without workers, ``watched_loader`` for the evaluation / extraction loaders.
"""

import logging
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader

from reid_engine.config import ConfigError
from reid_engine.reliability.read_deadline import ReadDeadline, iterate_with_deadline
from reid_engine.runtime.run_plan import loader_workers
from reid_engine.utils import comm
from reid_engine.utils.registry import check_choice

from ..reliability.loader_watchdog import LoaderWatchdog, check_hang_timeout, install_in_worker
from .collate import TrainCollator, collate_samples
from .common import BAD_IMAGE_POLICIES, ImageItemSet, TrainImageSet
from .datasets import DatasetFormatError, get_dataset, is_video_dataset, merge_train_sets, resolve_data_root
from .datasets.catalog import dataset_class
from .image_cache import CACHE_CHOICES, build_image_cache
from .prefetcher import DevicePrefetcher
from .samplers import SAMPLER_REGISTRY, InferenceSampler, InfiniteSampler
from .tracklets import SAMPLE_METHODS, TRAIN_SAMPLE_METHODS, TrackletItemSet, TrainTrackletSet, is_tracklet_item
from .train_sampling import StreamBatchSampler, build_train_sampler, check_stream_resume, per_worker_batch
from .transforms import build_transforms
from .watched_loader import WatchedDataLoader, shutdown_workers

__all__ = ["build_reid_train_loader", "build_reid_test_loader", "build_reid_inference_loader", "check_data_config",
           "TrainLoader", "build_tracklet_inference_loader", "check_tracklet_config",
           # re-exported from collate, train_sampling and prefetcher
           "collate_samples", "TrainCollator", "StreamBatchSampler", "build_train_sampler", "per_worker_batch",
           "DevicePrefetcher"]

logger = logging.getLogger(__name__)


def _worker_init(worker_id: int) -> None:
    # Workers each run one image at a time: extra intra-op threads would only oversubscribe.
    torch.set_num_threads(1)
    install_in_worker(worker_id)  # report reads to the training loader's hang watchdog, if any


def _loader_kwargs(num_workers: int) -> Dict[str, Any]:
    """DataLoader arguments shared by the train and test loaders (`num_workers`: the run plan's)."""
    kwargs: Dict[str, Any] = {"num_workers": num_workers,
                              "pin_memory": torch.cuda.is_available()}
    if num_workers > 0:
        kwargs["worker_init_fn"] = _worker_init
    return kwargs


def _test_loader_kwargs(cfg, what: str) -> Dict[str, Any]:
    """WatchedDataLoader arguments of the evaluation / extraction loaders (the run plan's loader
    workers, DATALOADER.HANG_TIMEOUT; ``what``: a batch, as the hang error names it)."""
    return dict(_loader_kwargs(loader_workers(cfg)), hang_timeout=cfg.DATALOADER.HANG_TIMEOUT, what=what)


class BadImageLog:
    """Counts and logs the unreadable training images DATALOADER.ON_BAD_IMAGE skip replaced.

    The first few are logged one line each when seen; at the end of each epoch that
    replaced any, one line gives the count so far and the first paths.

    Args:
        num_items: training items (an epoch).
        global_batch: images per step over all workers.
    """

    SHOWN = 5

    def __init__(self, num_items: int, global_batch: int):
        self.batches_per_epoch = max(1, num_items // max(1, global_batch))
        self.count = 0
        self.first: List[str] = []
        self._count_at_last_summary = 0

    def add(self, entries: Sequence[Tuple[str, str, str]], num_batches: int) -> None:
        """Record the ``(path, where, reason)`` entries of the batch number ``num_batches``."""
        for path, where, reason in entries:
            self.count += 1
            if len(self.first) < self.SHOWN:
                self.first.append(path)
                logger.warning("DATALOADER.ON_BAD_IMAGE skip: cannot read image '%s', %s (%s); replaced by "
                               "another image of the same identity", path, where, reason)
        if num_batches % self.batches_per_epoch == 0 and self.count > self._count_at_last_summary:
            self._count_at_last_summary = self.count
            logger.warning("%d unreadable training image(s) replaced so far (DATALOADER.ON_BAD_IMAGE skip), "
                           "first: %s", self.count, ", ".join(self.first))


class TrainLoader:
    """An endless iterable of training batches that can be checkpointed and resumed.

    Attributes:
        dataset: the :class:`TrainImageSet` (``num_classes``, ``num_cameras``, ``len``).
        sampler: the training sampler.
        batch_size: samples per batch on this rank.

    Args:
        dataset: the training dataset.
        sampler: the training sampler (its ``seed`` is the stream seed).
        batch_size: samples per batch on this rank.
        collate: the collate function.
        num_workers: loader worker processes (0 = decode in the main process, in a daemon thread one
            batch ahead under the read deadline).
        hang_timeout: seconds without a batch before a hung worker ends the run, or that one read may
            take without workers (0 = automatic; DATALOADER.HANG_TIMEOUT, see reliability.loader_watchdog).
    """

    def __init__(self, dataset: TrainImageSet, sampler: InfiniteSampler, batch_size: int,
                 collate, num_workers: int = 0, hang_timeout: float = 0.0):
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.collate = collate
        self.num_workers = int(num_workers)
        self.hang_timeout = check_hang_timeout(hang_timeout)
        self._num_batches = 0  # batches handed to the caller
        self._iterator: Optional[Iterator] = None
        self.bad_images = BadImageLog(len(dataset), self.batch_size * getattr(sampler, "world_size", 1))

    def _make_iterator(self) -> Iterator:
        self.sampler.set_start(self._num_batches * self.batch_size)
        kwargs = _loader_kwargs(self.num_workers)
        if self.num_workers > 0:
            kwargs["persistent_workers"] = True
        loader = DataLoader(self.dataset, batch_sampler=StreamBatchSampler(self.sampler,
                                                                           self.batch_size),
                            collate_fn=self.collate, **kwargs)
        if self.num_workers == 0:  # a daemon thread reads, so that a read that never returns ends the run
            return iterate_with_deadline(iter(loader), ReadDeadline(self.hang_timeout, what="a training batch"),
                                         name="data-loader")
        return iter(loader)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        # All iterators share one underlying stream: a second iter() continues it.
        if self._iterator is None:
            # Before the workers start: they find the watchdog's board on the dataset.
            self._watchdog = LoaderWatchdog(self.dataset, self.num_workers, self.hang_timeout)
            self._iterator = self._make_iterator()
        while True:
            try:
                batch = self._watchdog.next_batch(self._iterator)
            except BaseException:
                # Stop the workers now: left to the garbage collector (the traceback holds
                # the iterator in a cycle) their shutdown can stall for seconds.
                self.close()
                raise
            self._num_batches += 1
            self.bad_images.add(batch.pop("bad_images", ()), self._num_batches)
            yield batch

    def state_dict(self) -> Dict[str, int]:
        """Return ``{"seed", "num_batches", "batch_size", "world_size"}``: the stream, how far the
        caller has read it (batches read ahead by workers are not counted) and how it was split."""
        return {"seed": self.sampler.seed, "num_batches": self._num_batches,
                "batch_size": self.batch_size, "world_size": self.sampler.world_size}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Continue the stream saved by :meth:`state_dict` (call before iterating), also on
        another number of workers with the same global batch (see :func:`check_stream_resume`).

        Raises:
            RuntimeError: the loader has already started.
            ConfigError: the stream cannot continue here (another global batch, or a sampler
                whose stream follows the number of workers); one line with the fix.
        """
        if self._iterator is not None:
            raise RuntimeError("TrainLoader.load_state_dict must be called before iterating "
                               "the loader; load the checkpoint first, then start training")
        check_stream_resume(state, self.sampler, self.batch_size)
        self.sampler.load_state_dict({"seed": int(state["seed"]), "start": 0})
        self._num_batches = int(state["num_batches"])

    def close(self) -> None:
        """Stop the worker processes or the reader thread (a later iteration starts new ones where it left off)."""
        iterator, self._iterator = self._iterator, None
        shutdown_workers(iterator)


def check_data_config(cfg) -> None:
    """Check the enumerated data values (dataset names, sampler) without reading any data.

    Reads DATASETS.NAMES, DATASETS.TESTS, DATALOADER.SAMPLER_TRAIN, DATALOADER.ON_BAD_IMAGE,
    DATALOADER.CACHE_IMAGES, DATALOADER.HANG_TIMEOUT and INPUT.* (through the transform builder).

    Args:
        cfg: the config.
    Raises:
        UnknownChoiceError: a name that is not registered (one line: key, choices, closest).
        ConfigError: a ``:value`` for a dataset that takes none, or a wrong INPUT value.
    """
    for key in ("DATASETS.NAMES", "DATASETS.TESTS"):
        section, field = key.split(".")
        for name in cfg[section][field]:
            dataset_class(name, key)
    SAMPLER_REGISTRY.get(cfg.DATALOADER.SAMPLER_TRAIN)
    check_choice(cfg.DATALOADER.ON_BAD_IMAGE, BAD_IMAGE_POLICIES, "DATALOADER.ON_BAD_IMAGE")
    check_hang_timeout(cfg.DATALOADER.HANG_TIMEOUT)
    check_choice(cfg.DATALOADER.CACHE_IMAGES, CACHE_CHOICES, "DATALOADER.CACHE_IMAGES")
    check_tracklet_config(cfg)
    for is_train in (True, False):  # building the pipelines only checks INPUT.* (cheap)
        build_transforms(cfg, is_train=is_train)


def check_tracklet_config(cfg) -> None:
    """Check INPUT.SEQ_LEN, INPUT.SAMPLE_METHOD and TEST.SAMPLE_METHOD (read by video datasets only).

    Raises:
        ConfigError / UnknownChoiceError: a value out of range (one line naming the key).
    """
    if isinstance(cfg.INPUT.SEQ_LEN, bool) or not isinstance(cfg.INPUT.SEQ_LEN, int) or cfg.INPUT.SEQ_LEN < 1:
        raise ConfigError(f"INPUT.SEQ_LEN must be a positive integer (frames per tracklet), got {cfg.INPUT.SEQ_LEN!r}")
    if cfg.INPUT.SAMPLE_METHOD == "all":
        raise ConfigError("INPUT.SAMPLE_METHOD 'all' gives tracklets of different lengths, which cannot form a "
                          "training batch; use evenly or random (all is for TEST.SAMPLE_METHOD)")
    check_choice(cfg.INPUT.SAMPLE_METHOD, TRAIN_SAMPLE_METHODS, "INPUT.SAMPLE_METHOD")
    check_choice(cfg.TEST.SAMPLE_METHOD, SAMPLE_METHODS, "TEST.SAMPLE_METHOD")


def _video_kind(datasets, names: Sequence[str]) -> bool:
    """True when every set is a tracklet set, False when none is; mixing them is an error."""
    kinds = {is_video_dataset(ds) for ds in datasets}
    if len(kinds) > 1:
        raise ConfigError(f"DATASETS.NAMES {list(names)} mixes image and video (tracklet) datasets; train on "
                          f"one kind at a time")
    return kinds == {True}


def build_reid_train_loader(cfg) -> TrainLoader:
    """Build the endless training loader over ``DATASETS.NAMES`` (merged).

    Reads DATASETS.NAMES / ROOT / COMBINEALL, DATALOADER.*, SOLVER.IMS_PER_BATCH and SEED
    (and INPUT.SEQ_LEN / SAMPLE_METHOD for tracklet sets, where IMS_PER_BATCH and
    NUM_INSTANCE count tracklets and batches hold (B, SEQ_LEN, 3, H, W) images).
    The stream seed is ``SEED`` when >= 0, else a random seed shared by all ranks; it is part
    of the loader's state, so a resumed run continues the same stream. Each image's domain
    is the position of its training set in DATASETS.NAMES (0 for a single set).

    Args:
        cfg: the config.
    Returns:
        A :class:`TrainLoader` yielding ``{"images", "targets", "camids", "domains",
        "img_paths"}``.
    """
    root = resolve_data_root(cfg.DATASETS.ROOT)
    names = list(cfg.DATASETS.NAMES)
    if not names:
        raise ConfigError("DATASETS.NAMES is empty; name at least one training set")
    datasets = [get_dataset(name, root, combineall=cfg.DATASETS.COMBINEALL, split_id=cfg.DATASETS.SPLIT_ID)
                for name in names]
    items, num_classes, num_cameras = merge_train_sets(datasets)
    if not items:
        raise DatasetFormatError(f"the training split of {names} is empty; check the dataset folders "
                                 f"under the data root '{root}'")
    # merge_train_sets keeps dataset order, so each item's domain follows from the set sizes.
    domains = np.repeat(np.arange(len(datasets)), [len(ds.train) for ds in datasets])
    batch_size = per_worker_batch(cfg.SOLVER.IMS_PER_BATCH, comm.get_world_size(),
                                   "SOLVER.IMS_PER_BATCH")
    seed = int(cfg.SEED) if cfg.SEED >= 0 else comm.shared_random_seed()
    sampler = build_train_sampler(cfg, items, domains, batch_size, seed)
    pipeline = build_transforms(cfg, is_train=True)
    options = {"domain_names": names,
               "on_bad_image": check_choice(cfg.DATALOADER.ON_BAD_IMAGE, BAD_IMAGE_POLICIES, "DATALOADER.ON_BAD_IMAGE")}
    if _video_kind(datasets, names):
        check_tracklet_config(cfg)
        dataset = TrainTrackletSet(items, pipeline, num_classes, num_cameras, domains=domains,
                                   seq_len=cfg.INPUT.SEQ_LEN, method=cfg.INPUT.SAMPLE_METHOD, **options)
    else:
        cache = build_image_cache(cfg, [path for path, _, _ in items], pipeline)
        dataset = TrainImageSet(items, pipeline, num_classes, num_cameras, domains=domains, cache=cache, **options)
    if len(names) > 1:
        logger.info("Training domains: %s", ", ".join(
            f"{d} = {name} ({ds.num_train_pids} ids)" for d, (name, ds) in enumerate(zip(names, datasets))))
    num_workers = loader_workers(cfg)
    logger.info("Train loader: %d items, %d ids, %d cameras from %s; %s, %d images per batch "
                "per worker, %d loader workers, stream seed %d", len(items), num_classes,
                num_cameras, ", ".join(names), type(sampler).__name__, batch_size,
                num_workers, seed)
    return TrainLoader(dataset, sampler, batch_size, TrainCollator(pipeline), num_workers=num_workers,
                       hang_timeout=cfg.DATALOADER.HANG_TIMEOUT)


def build_reid_test_loader(cfg, dataset_name: str) -> Tuple[DataLoader, int]:
    """Build the evaluation loader of one test set: query images first, then gallery.

    Each rank gets a contiguous :class:`InferenceSampler` shard; batches of
    ``TEST.IMS_PER_BATCH // world size`` (at least 1) images with the test transforms.

    Args:
        cfg: the config (DATASETS.ROOT, TEST.IMS_PER_BATCH, DATALOADER.NUM_WORKERS, INPUT.*).
        dataset_name: the test set, as written in DATASETS.TESTS.
    Returns:
        ``(loader, num_query)``.
    """
    dataset = get_dataset(dataset_name, resolve_data_root(cfg.DATASETS.ROOT), key="DATASETS.TESTS",
                          split_id=cfg.DATASETS.SPLIT_ID)
    items = list(dataset.query) + list(dataset.gallery)
    if not dataset.query or not dataset.gallery:
        raise DatasetFormatError(f"{dataset_name}: the query or gallery split is empty; check its "
                                 f"folders under the data root")
    return build_reid_inference_loader(cfg, items, name=f"{dataset_name} query + gallery"), len(dataset.query)


def build_tracklet_inference_loader(cfg, items: Sequence[Tuple[Tuple[str, ...], int, int]],
                                    transform: Optional[Callable] = None) -> DataLoader:
    """A loader of (B, T, 3, H, W) tracklet batches over this rank's shard of ``items``, in order.

    TEST.IMS_PER_BATCH counts tracklets; with TEST.SAMPLE_METHOD ``all`` (tracklets of
    different lengths) every batch holds one tracklet.

    Args:
        cfg: the config (INPUT.SEQ_LEN, TEST.SAMPLE_METHOD, TEST.IMS_PER_BATCH, DATALOADER.NUM_WORKERS).
        items: every ``(frame paths, pid, camid)`` of the job, in order.
        transform: the frame pipeline (default: `build_transforms(cfg, is_train=False)`).
    Returns:
        a :class:`WatchedDataLoader` (a read stuck past DATALOADER.HANG_TIMEOUT ends it in one line) of
        ``{"images", "targets", "camids", "img_paths"}`` batches.
    """
    check_tracklet_config(cfg)
    method = cfg.TEST.SAMPLE_METHOD
    batch_size = 1 if method == "all" else max(1, cfg.TEST.IMS_PER_BATCH // comm.get_world_size())
    pipeline = transform if transform is not None else build_transforms(cfg, is_train=False)
    dataset = TrackletItemSet(items, pipeline, cfg.INPUT.SEQ_LEN, method)
    return WatchedDataLoader(dataset, batch_sampler=BatchSampler(InferenceSampler(len(items)), batch_size, drop_last=False),
                             collate_fn=collate_samples, **_test_loader_kwargs(cfg, "batch of tracklets"))


def build_reid_inference_loader(cfg, items: Sequence[Tuple[str, int, int]],
                                transform: Optional[Callable] = None, name: str = "",
                                cache=None) -> DataLoader:
    """A loader over this rank's contiguous shard of `items`, in item order.

    Used for evaluation and for feature extraction of any list of images or tracklets
    (``(frame paths, pid, camid)`` items go to :func:`build_tracklet_inference_loader`).

    Args:
        cfg: the config (TEST.IMS_PER_BATCH split over the workers, DATALOADER.NUM_WORKERS,
            INPUT.* for the default test transforms).
        items: every `(path, pid, camid)` of the job, in order.
        transform: the image pipeline (default: `build_transforms(cfg, is_train=False)`).
        name: what the items are, named with the index of an unreadable image.
        cache: an :class:`~reid_engine.data.image_cache.ImageCache` to read decoded images from
            when it holds the pipeline's prefix (e.g. the training cache, for the label-free
            hook's extraction), or None.
    Returns:
        a :class:`WatchedDataLoader` (a read stuck past DATALOADER.HANG_TIMEOUT ends it in one line) of
        `{"images", "targets", "camids", "img_paths"}` batches.
    """
    if len(items) and is_tracklet_item(items[0]):
        return build_tracklet_inference_loader(cfg, items, transform)
    batch_size = max(1, cfg.TEST.IMS_PER_BATCH // comm.get_world_size())
    sampler = InferenceSampler(len(items))
    pipeline = transform if transform is not None else build_transforms(cfg, is_train=False)
    # Test loaders run now and then; non-persistent workers free their memory in between.
    return WatchedDataLoader(ImageItemSet(items, pipeline, name=name, cache=cache),
                             batch_sampler=BatchSampler(sampler, batch_size, drop_last=False), collate_fn=collate_samples,
                             **_test_loader_kwargs(cfg, f"batch of {name}" if name else "batch of images"))
