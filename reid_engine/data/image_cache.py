"""DATALOADER.CACHE_IMAGES: training images decoded and resized once, then kept in memory.

Decoding a JPEG and resizing it is most of a loader worker's work per image, and it gives the
same pixels every epoch: only the random ops after it (pad-crop, flip, erasing, ...) differ.
The cache holds every training image after the pipeline's deterministic prefix
(:meth:`AugmentationPipeline.prefix`: decode, resize) in one uint8 tensor. It is filled in the
main process before the loader workers start, by a pool of threads (Pillow releases the GIL
while it decodes and resizes) under the read deadline of DATALOADER.HANG_TIMEOUT (a read that
never returns ends the fill with one line naming the file), and never written afterwards: forked workers share its pages,
spawned ones receive it through torch's shared memory. A cached sample is byte-identical to
a decoded one, so the training stream does not depend on the setting.
"""

import logging
import os
import time
from typing import Iterable, Optional, Sequence, Tuple

import numpy as np
import torch

from reid_engine.config import ConfigError
from reid_engine.config.on_off_keys import ON_OFF_CHOICES
from reid_engine.reliability.read_deadline import ReadDeadline, map_with_deadline
from reid_engine.utils import comm
from reid_engine.utils.registry import check_choice

from ..reliability.loader_watchdog import check_hang_timeout
from .common import ImageReadError, decode_scale, read_image

__all__ = ["ImageCache", "build_image_cache", "CACHE_CHOICES", "available_memory"]

logger = logging.getLogger(__name__)

#: DATALOADER.CACHE_IMAGES values
CACHE_CHOICES = ON_OFF_CHOICES
#: ``auto`` caches when the caches of all processes of this machine fit in this share of the
#: memory available when the loader is built
AUTO_MEMORY_SHARE = 0.25
PROGRESS_SECONDS = 5.0
_CHUNK = 64  # images per thread task: large enough that the pool's overhead does not show


def available_memory() -> Optional[int]:
    """Bytes of memory available to new allocations (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class ImageCache:
    """Every distinct path of a training set after a pipeline's prefix, as (H, W, 3) uint8.

    Any pipeline with the same :meth:`AugmentationPipeline.prefix_signature` can read it, and so
    can one with the same prefix ops that decodes at full size (a test pipeline) when no cached
    image was decoded at reduced scale (training pipelines may use JPEG draft mode; test
    pipelines never do): the label-free hook's feature extraction uses the training cache when
    INPUT.SIZE_TEST equals INPUT.SIZE_TRAIN and the images are less than twice that size.

    Args:
        paths: the image files (duplicates share one slot).
        pipeline: the pipeline whose prefix the cache holds (``pipeline.prefix_size()`` must
            not be None).
    """

    def __init__(self, paths: Iterable[str], pipeline):
        size = pipeline.prefix_size()
        if size is None:
            raise ValueError("ImageCache: the pipeline does not start with a resize or crop to a fixed size")
        self.signature = pipeline.prefix_signature()
        self.slots = {path: slot for slot, path in enumerate(dict.fromkeys(paths))}
        self.size = (int(size[0]), int(size[1]))
        self.pixels = torch.zeros((len(self.slots), *self.size, 3), dtype=torch.uint8)
        self.filled = np.zeros(len(self.slots), dtype=bool)
        #: every cached image was decoded at full size (set by :meth:`fill`)
        self.full_size_decodes = False

    @staticmethod
    def bytes_needed(num_images: int, size: Tuple[int, int]) -> int:
        """The memory a cache of ``num_images`` images of ``size`` (height, width) holds."""
        return int(num_images) * int(size[0]) * int(size[1]) * 3

    @property
    def nbytes(self) -> int:
        """Bytes held by the pixels."""
        return self.pixels.numel()

    def __len__(self) -> int:
        return len(self.slots)

    def serves(self, pipeline) -> bool:
        """Whether ``pipeline`` continues from this cache's images (same prefix, or the same ops
        decoding at full size when every cached image was)."""
        decode_size, ops = pipeline.prefix_signature()
        return (decode_size, ops) == self.signature or (
            decode_size is None and ops == self.signature[1] and self.full_size_decodes)

    def lookup(self, path: str) -> Optional[np.ndarray]:
        """The cached (H, W, 3) image of ``path`` as a read-only view, or None if it is not cached
        (unknown path, or an image that could not be read when the cache was filled)."""
        slot = self.slots.get(path)
        if slot is None or not self.filled[slot]:
            return None
        view = self.pixels[slot].numpy()
        view.flags.writeable = False  # an op that wrote in place would corrupt every later epoch
        return view

    def fill(self, pipeline, num_threads: int = 0, label: str = "training images", hang_timeout: float = 0.0) -> None:
        """Decode every image and apply ``pipeline.prefix``, with progress lines (``pipeline``
        must be one the cache :meth:`serves`).

        Images that cannot be read, or whose prefix output has another size, stay uncached:
        the loader then reads them as before (and reports an unreadable one its usual way).

        Args:
            pipeline: the training :class:`AugmentationPipeline` (its prefix gives ``size``).
            num_threads: decoding threads (0: one per CPU core this process may use).
            label: what the progress lines call the images.
            hang_timeout: seconds one read may take (DATALOADER.HANG_TIMEOUT; 0 = automatic).
        Raises:
            ReadHangError: a read did not return within the limit (one line naming the file).
        """
        paths = list(self.slots)
        total = len(paths)
        if not num_threads:
            num_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, int(num_threads))
        start = last_report = time.perf_counter()
        done = unreadable = reduced = 0
        chunks = [range(i, min(i + _CHUNK, total)) for i in range(0, total, _CHUNK)]
        deadline = ReadDeadline(hang_timeout, what="the decoded-image cache")
        for count, failed, drafted in map_with_deadline(lambda chunk: self._fill_chunk(paths, chunk, pipeline), chunks,
                                                        threads, deadline, name="image-cache"):
            done, unreadable, reduced = done + count, unreadable + failed, reduced + drafted
            now = time.perf_counter()
            if now - last_report >= PROGRESS_SECONDS and done < total:
                last_report = now
                logger.info("Image cache: decoded %s / %s %s (%.0f s, ETA %.0f s)", f"{done:,}",
                            f"{total:,}", label, now - start, (now - start) / done * (total - done))
        self.full_size_decodes = reduced == 0
        seconds = time.perf_counter() - start
        logger.info("Image cache: %s %s decoded and resized to %dx%d once, %.0f MB in memory (%.1f s, %d threads)%s",
                    f"{int(self.filled.sum()):,}", label, *self.size, self.nbytes / 2 ** 20, seconds, threads,
                    f"; {unreadable} not cached (unreadable or of another size), read per sample" if unreadable else "")

    def _fill_chunk(self, paths: Sequence[str], chunk: range, pipeline) -> Tuple[int, int, int]:
        """Fill the slots of ``chunk``; returns (images, unreadable or of another size, decoded at reduced scale)."""
        failed = reduced = 0
        for slot in chunk:
            try:
                decoded = read_image(paths[slot], pipeline.decode_size)
                image = pipeline.prefix(decoded)
            except ImageReadError:
                failed += 1
                continue
            if image.shape != (*self.size, 3):
                failed += 1
                continue
            self.pixels[slot].numpy()[...] = image
            self.filled[slot] = True
            reduced += decode_scale(decoded) > 1
        return len(chunk), failed, reduced


def build_image_cache(cfg, paths: Sequence[str], pipeline) -> Optional[ImageCache]:
    """Build and fill the cache DATALOADER.CACHE_IMAGES asks for, or return None; logs why.

    ``auto`` caches when the pipeline starts with a resize (or crop) to a fixed size and the
    caches of this machine's training processes fit in AUTO_MEMORY_SHARE of its available
    memory; ``on`` always caches (and needs that fixed-size start); ``off`` never does.

    Args:
        cfg: the config (DATALOADER.CACHE_IMAGES).
        paths: the training image files.
        pipeline: the training :class:`AugmentationPipeline`.
    Returns:
        A filled :class:`ImageCache`, or None.
    Raises:
        UnknownChoiceError: DATALOADER.CACHE_IMAGES is not auto, on or off.
        ConfigError: ``on`` with a pipeline whose first ops do not give every image one size.
        ReadHangError: a read did not return within DATALOADER.HANG_TIMEOUT (one line naming the file).
    """
    mode = check_choice(cfg.DATALOADER.CACHE_IMAGES, CACHE_CHOICES, "DATALOADER.CACHE_IMAGES")
    if mode == "off" or not paths:
        return None
    size = pipeline.prefix_size()
    if size is None:
        if mode == "on":
            raise ConfigError("DATALOADER.CACHE_IMAGES on needs a training pipeline that first resizes every image "
                              "to one size (INPUT.SIZE_TRAIN, and no INPUT.AUTOAUG before it); set it to auto or off")
        logger.info("Image cache: off (DATALOADER.CACHE_IMAGES auto: the training pipeline does not start with a "
                    "resize to a fixed size)")
        return None
    num_images = len(set(paths))
    needed = ImageCache.bytes_needed(num_images, size) * comm.get_local_size()
    available = available_memory()
    if mode == "auto" and (available is None or needed > AUTO_MEMORY_SHARE * available):
        room = "unknown" if available is None else f"{available / 2 ** 30:.1f} GB"
        logger.info("Image cache: off (DATALOADER.CACHE_IMAGES auto: %s images at %dx%d need %.2f GB on this machine, "
                    "more than %d%% of the %s available; set it to on to cache anyway)", f"{num_images:,}", *size,
                    needed / 2 ** 30, round(100 * AUTO_MEMORY_SHARE), room)
        return None
    cache = ImageCache(paths, pipeline)
    cache.fill(pipeline, hang_timeout=check_hang_timeout(cfg.DATALOADER.HANG_TIMEOUT))
    return cache
