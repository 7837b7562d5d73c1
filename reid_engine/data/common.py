"""Image decoding and the torch ``Dataset`` wrappers that turn items into augmented samples."""

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from ..utils.errors import ReidUserError

__all__ = ["ImageReadError", "read_image", "ImageItemSet", "TrainImageSet", "sample_rng"]

Item = Tuple[str, int, int]  # (img_path, pid, camid)


class ImageReadError(ReidUserError, RuntimeError):
    """An image file is missing, unreadable or corrupt; the message names its path."""


def read_image(path: str, draft_size: Optional[Tuple[int, int]] = None) -> Image.Image:
    """Decode an image file into an RGB PIL image.

    Args:
        path: the image file.
        draft_size: ``(width, height)`` the image will be resized to; a JPEG is then decoded
            at the smallest DCT scale that is still at least this large (faster, no visible
            loss once resized). ``None`` decodes at full resolution.
    Returns:
        A loaded RGB ``PIL.Image.Image``.
    Raises:
        ImageReadError: the file cannot be opened or decoded (one line naming the path).
    """
    try:
        img = Image.open(path)
        if draft_size is not None and img.format == "JPEG":
            img.draft("RGB", draft_size)
        img.load()  # decodes now (so errors surface here) and closes the file
        return img if img.mode == "RGB" else img.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise ImageReadError(f"cannot read image '{path}' ({type(err).__name__}: {err}); "
                             f"replace or remove the file from the dataset") from None


def sample_rng(stream_seed: int, rank: int, position: int, purpose: int = 1) -> np.random.Generator:
    """Return the generator of one sample (``purpose`` 1) or one batch (2) of a stream.

    Args:
        stream_seed: the loader's stream seed.
        rank: the process rank (ranks augment their own shares differently).
        position: the position of the sample (or the batch's first sample) in the rank's stream.
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
    """

    def __init__(self, items: Sequence[Item], transform):
        self.items = list(items)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def load(self, index: int, rng: Optional[np.random.Generator]) -> Dict[str, Any]:
        """Decode and transform item ``index`` with ``rng``; return the sample dict."""
        path, pid, camid = self.items[index]
        img = read_image(path, getattr(self.transform, "decode_size", None))
        return {"image": self.transform(img, rng), "target": pid, "camid": camid,
                "img_path": path}

    def __getitem__(self, index: int) -> Dict[str, Any]:
        return self.load(index, None)


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
    Raises:
        ValueError: ``domains`` is not one index per item.
    """

    def __init__(self, items: Sequence[Item], transform, num_classes: int, num_cameras: int,
                 domains: Optional[Sequence[int]] = None):
        super().__init__(items, transform)
        self.num_classes = int(num_classes)
        self.num_cameras = int(num_cameras)
        self.domains = (np.zeros(len(self.items), dtype=np.int64) if domains is None
                        else np.asarray(domains, dtype=np.int64))
        if self.domains.shape != (len(self.items),):
            raise ValueError(f"TrainImageSet: {self.domains.size} domain indices for "
                             f"{len(self.items)} items")
        self.num_domains = int(self.domains.max()) + 1 if len(self.items) else 0

    def __getitem__(self, key) -> Dict[str, Any]:
        index, stream_key = key
        sample = self.load(index, sample_rng(*stream_key))
        sample["domain"] = int(self.domains[index])
        sample["stream_key"] = stream_key
        return sample
