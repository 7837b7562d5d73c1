"""Image decoding and the torch ``Dataset`` wrappers that turn items into augmented samples.

An image that cannot be read fails with a one-line :class:`ImageReadError` naming the file,
the dataset and the item's index; a training set built with ``on_bad_image="skip"``
(DATALOADER.ON_BAD_IMAGE) replaces it by another image of the same identity instead and
reports it in the sample (``"bad_images"``) for the loader to log.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from ..reliability.read_deadline import reading
from ..utils.errors import ReidUserError

__all__ = ["ImageReadError", "read_image", "decode_scale", "ImageItemSet", "TrainImageSet", "sample_rng", "BAD_IMAGE_POLICIES"]

Item = Tuple[str, int, int]  # (img_path, pid, camid)

#: DATALOADER.ON_BAD_IMAGE: stop with an error naming the file, or train on with another image of its identity
BAD_IMAGE_POLICIES = ("error", "skip")
#: the ``Image.info`` entry in which :func:`read_image` records a reduced-scale (draft) decode
_DECODE_SCALE = "reid_engine_decode_scale"


class ImageReadError(ReidUserError, RuntimeError):
    """An image file is missing, unreadable or corrupt; the message names its path.

    Args:
        message: the one-line message.
        path: the file (when known).
        reason: why it cannot be read, e.g. "OSError: image file is truncated".
    """

    def __init__(self, message: str, path: str = "", reason: str = ""):
        super().__init__(message)
        self.path, self.reason = path, reason


def read_image(path: str, draft_size: Optional[Tuple[int, int]] = None) -> Image.Image:
    """Decode an image file into an RGB PIL image.

    Args:
        path: the image file.
        draft_size: ``(width, height)`` the image will be resized to; a JPEG is then decoded
            at the smallest DCT scale that is still at least this large (faster, no visible
            loss once resized, but other pixels than a full decode: training pipelines only).
            ``None`` decodes at full resolution.
    Returns:
        A loaded RGB ``PIL.Image.Image``; :func:`decode_scale` tells whether it was reduced.
    Raises:
        ImageReadError: the file cannot be opened or decoded (one line naming the path).
    """
    try:
        with reading(path):  # a read that never returns is named by the read deadlines (reliability)
            img = Image.open(path)
            scale = 1
            if draft_size is not None and img.format == "JPEG":
                width = img.width
                if img.draft("RGB", draft_size) is not None:
                    scale = max(1, round(width / img.width))
            img.load()  # decodes now (so errors surface here) and closes the file
        img = img if img.mode == "RGB" else img.convert("RGB")  # convert copies `info`
        if scale > 1:
            img.info[_DECODE_SCALE] = scale
        return img
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        reason = f"{type(err).__name__}: {err}"
        raise ImageReadError(f"cannot read image '{path}' ({reason}); replace or remove the file from the dataset",
                             path=path, reason=reason) from None


def decode_scale(image: Image.Image) -> int:
    """The factor :func:`read_image` reduced ``image`` by while decoding (1: full size)."""
    return int(image.info.get(_DECODE_SCALE, 1))


def sample_rng(stream_seed: int, rank: int, position: int, purpose: int = 1) -> np.random.Generator:
    """Return the generator of one sample (``purpose`` 1) or one batch (2) of a stream.

    Args:
        stream_seed: the loader's stream seed.
        rank: 0 for training samples: their keys are global stream positions, so a sample is
            augmented alike for any number of workers.
        position: the sample's (or the batch's first sample's) position in the global stream.
        purpose: a non-zero tag keeping per-sample and per-batch generators apart.
    """
    return np.random.default_rng([stream_seed, rank, position, purpose])


class ImageItemSet(Dataset):
    """Map-style dataset of ``(img_path, pid, camid)`` items through a deterministic transform.

    ``dataset[i]`` is ``{"image": (3, H, W) uint8, "target": pid, "camid": camid,
    "img_path": path}``.

    Args:
        items: the items.
        transform: an :class:`~reid_engine.data.transforms.AugmentationPipeline`
            (a test pipeline: it is called without a generator).
        name: what the items are (e.g. "Market1501 query + gallery"), for error messages.
        cache: an :class:`~reid_engine.data.image_cache.ImageCache` of the items' images
            (DATALOADER.CACHE_IMAGES), used when it holds ``transform``'s prefix; None decodes
            every time.
    """

    def __init__(self, items: Sequence[Item], transform, name: str = "", cache=None):
        self.items = list(items)
        self.transform = transform
        self.name = name
        self.cache = cache if cache is not None and cache.serves(transform) else None

    def __len__(self) -> int:
        return len(self.items)

    def load(self, index: int, rng: Optional[np.random.Generator]) -> Dict[str, Any]:
        """Decode (or take from the cache) and transform item ``index`` with ``rng``; return the sample dict."""
        path, pid, camid = self.items[index]
        cached = self.cache.lookup(path) if self.cache is not None else None
        if cached is not None:
            image = self.transform(cached, rng, from_prefix=True)
        else:
            image = self.transform(read_image(path, getattr(self.transform, "decode_size", None)), rng)
        return {"image": image, "target": pid, "camid": camid, "img_path": path}

    def describe_item(self, index: int) -> str:
        """Where item ``index`` comes from, for messages: "item 12 of Market1501"."""
        return f"item {index} of {self.name}" if self.name else f"item {index}"

    def _unreadable(self, err: ImageReadError, index: int, fix: str) -> ImageReadError:
        return ImageReadError(f"cannot read image '{err.path}' ({err.reason}), {self.describe_item(index)}: {fix}",
                              path=err.path, reason=err.reason)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        try:
            return self.load(index, None)
        except ImageReadError as err:
            raise self._unreadable(err, index, "replace or remove the file from the dataset") from None


class TrainImageSet(ImageItemSet):
    """Training dataset: keys are ``(index, (stream_seed, rank, position))``.

    The second part seeds the sample's augmentation generator (see :func:`sample_rng`), so a
    sample's augmentation depends only on where it sits in the stream, not on the worker
    process that builds it. The sample dict also carries that ``"stream_key"`` and the
    item's ``"domain"``: the position of its training set in ``DATASETS.NAMES``.

    Args:
        items: the merged training items (relabelled pids, 0-based cameras).
        transform: the training pipeline.
        num_classes: number of training identities.
        num_cameras: number of training cameras.
        domains: the domain index of every item (``None``: all 0, a single source).
        domain_names: the training set name of each domain (for messages).
        on_bad_image: "error" (an unreadable image stops training with a message naming the
            file, its set and its index) or "skip" (it is replaced by another image of the
            same identity, so identity-balanced batches keep their P x K shape; the sample
            then lists what it replaced under ``"bad_images"``: ``(path, where, reason)``).
        cache: the items' :class:`~reid_engine.data.image_cache.ImageCache` (or None).
    Raises:
        ValueError: ``domains`` is not one index per item.
    """

    def __init__(self, items: Sequence[Item], transform, num_classes: int, num_cameras: int,
                 domains: Optional[Sequence[int]] = None, domain_names: Sequence[str] = (),
                 on_bad_image: str = "error", cache=None):
        super().__init__(items, transform, cache=cache)
        self.num_classes = int(num_classes)
        self.num_cameras = int(num_cameras)
        self.domains = (np.zeros(len(self.items), dtype=np.int64) if domains is None
                        else np.asarray(domains, dtype=np.int64))
        if self.domains.shape != (len(self.items),):
            raise ValueError(f"TrainImageSet: {self.domains.size} domain indices for "
                             f"{len(self.items)} items")
        self.num_domains = int(self.domains.max()) + 1 if len(self.items) else 0
        self.domain_names = list(domain_names)
        if on_bad_image not in BAD_IMAGE_POLICIES:
            raise ValueError(f"on_bad_image must be one of {BAD_IMAGE_POLICIES}, got {on_bad_image!r}")
        self.on_bad_image = on_bad_image
        self._same_identity: Optional[Dict[int, List[int]]] = None

    def describe_item(self, index: int) -> str:
        """Where training item ``index`` comes from: "training item 12 (Market1501)"."""
        domain = int(self.domains[index])
        name = self.domain_names[domain] if domain < len(self.domain_names) else ""
        return f"training item {index} ({name})" if name else f"training item {index}"

    def __getitem__(self, key) -> Dict[str, Any]:
        index, stream_key = key
        try:
            sample = self.load(index, sample_rng(*stream_key))
        except ImageReadError as err:
            if self.on_bad_image != "skip":
                raise self._unreadable(err, index, "replace or remove the file, or set DATALOADER.ON_BAD_IMAGE "
                                       "skip to train on with another image of the same identity") from None
            index, sample = self._replacement(index, stream_key, err)
        sample["domain"] = int(self.domains[index])
        sample["stream_key"] = stream_key
        return sample

    def _replacement(self, index: int, stream_key, err: ImageReadError) -> Tuple[int, Dict[str, Any]]:
        """Load another item of the identity of ``index`` (tried in an order drawn from the
        sample's stream position, so any worker picks the same one)."""
        if self._same_identity is None:
            self._same_identity = {}
            for i, item in enumerate(self.items):
                self._same_identity.setdefault(int(item[1]), []).append(i)
        pid = int(self.items[index][1])
        bad = [(err.path, self.describe_item(index), err.reason)]
        others = [i for i in self._same_identity[pid] if i != index]
        for other in sample_rng(*stream_key, purpose=3).permutation(others):
            try:
                sample = self.load(int(other), sample_rng(*stream_key))
            except ImageReadError as other_err:
                bad.append((other_err.path, self.describe_item(int(other)), other_err.reason))
                continue
            sample["bad_images"] = bad
            return int(other), sample
        raise ImageReadError(
            f"DATALOADER.ON_BAD_IMAGE skip: no readable image of identity {pid} is left "
            f"({len(bad)} unreadable, first '{err.path}', {self.describe_item(index)}: {err.reason}); "
            "replace the files or remove the identity from the dataset", path=err.path, reason=err.reason)
