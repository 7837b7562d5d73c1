"""The transform protocol, image-type conversions and the pipeline that chains ops.

Every op is a callable ``op(img, rng) -> img``. ``rng`` is a ``numpy.random.Generator``
owned by the caller (deterministic ops ignore it), so the same generator seed gives the same
augmentation in any process. An op declares the image type it works on in ``input_kind``:

- ``"pil"``: a ``PIL.Image.Image`` in RGB mode;
- ``"array"``: a ``numpy`` uint8 array of shape (H, W, 3) (views are allowed, e.g. a flip);
- ``"tensor"``: a ``torch`` uint8 tensor of shape (3, H, W), values 0..255.

The pipeline converts between the three only when the next op needs another type, so a run of
array ops costs no copies and the tensor is made with exactly one copy.
"""

from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

__all__ = [
    "Transform", "RandomApply", "AugmentationPipeline", "to_pil", "to_array", "to_tensor",
    "image_size", "require_rng",
]


class Transform:
    """Base class of the ops: ``op(img, rng) -> img`` on the image type ``input_kind``."""

    input_kind = "array"
    #: True for ops whose output depends on the image only (no rng): a pipeline's leading run
    #: of them can be computed once per image and cached (DATALOADER.CACHE_IMAGES)
    deterministic = False

    def __call__(self, img, rng: Optional[np.random.Generator] = None):
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def require_rng(rng: Optional[np.random.Generator], op: Transform) -> np.random.Generator:
    """Return ``rng`` or raise a one-line error if a random op was given none."""
    if rng is None:
        raise ValueError(f"{type(op).__name__} is random: pass a numpy.random.Generator as its "
                         f"rng argument (e.g. numpy.random.default_rng(seed))")
    return rng


def to_pil(img) -> Image.Image:
    """Return ``img`` (PIL image, HWC uint8 array or CHW uint8 tensor) as an RGB PIL image."""
    if isinstance(img, Image.Image):
        return img if img.mode == "RGB" else img.convert("RGB")
    if isinstance(img, torch.Tensor):
        img = img.permute(1, 2, 0).numpy()
    return Image.fromarray(np.ascontiguousarray(img), mode="RGB")


def to_array(img) -> np.ndarray:
    """Return ``img`` as an (H, W, 3) uint8 array (no copy when it already is one)."""
    if isinstance(img, np.ndarray):
        return img
    if isinstance(img, torch.Tensor):
        return img.permute(1, 2, 0).numpy()
    return np.asarray(to_pil(img))


def to_tensor(img) -> torch.Tensor:
    """Return ``img`` as a contiguous (3, H, W) uint8 tensor, copying the pixels once."""
    if isinstance(img, torch.Tensor):
        return img
    arr = to_array(img)
    # The permuted copy is the single copy of the pixels into memory the tensor owns.
    return torch.from_numpy(arr.transpose(2, 0, 1).copy())


_CONVERTERS = {"pil": to_pil, "array": to_array, "tensor": to_tensor}


def convert(img, kind: str):
    """Return ``img`` converted to the image type ``kind`` ("pil", "array" or "tensor")."""
    return _CONVERTERS[kind](img)


def image_size(img) -> Tuple[int, int]:
    """Return ``(height, width)`` of a PIL image, HWC array or CHW tensor."""
    if isinstance(img, Image.Image):
        return img.height, img.width
    if isinstance(img, torch.Tensor):
        return int(img.shape[1]), int(img.shape[2])
    return int(img.shape[0]), int(img.shape[1])


class RandomApply(Transform):
    """Apply ``op`` with probability ``p`` (one draw from the rng per call).

    Args:
        op: the transform to apply.
        p: probability in [0, 1].
    """

    def __init__(self, op: Transform, p: float):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomApply: probability {p} is outside [0, 1]")
        self.op = op
        self.p = float(p)
        self.input_kind = op.input_kind

    def __call__(self, img, rng=None):
        rng = require_rng(rng, self)
        if rng.random() < self.p:
            return self.op(img, rng)
        return img


class AugmentationPipeline:
    """A chain of per-image ops, plus optional batch ops applied when batches are collated.

    Args:
        sample_ops: ops applied to each decoded image, in order; the result is a
            (3, H, W) uint8 tensor.
        batch_ops: ops ``op(images (B, 3, H, W) uint8, rng) -> images`` applied to a whole
            batch (ops that mix images, such as random patch).
        decode_size: ``(width, height)`` the images will be resized to, used to let the JPEG
            decoder skip resolution that would be thrown away (``None``: decode fully, as
            test pipelines do; ``build_transforms`` decides it).
    """

    def __init__(self, sample_ops: Sequence[Transform], batch_ops: Sequence[Transform] = (),
                 decode_size: Optional[Tuple[int, int]] = None):
        self.sample_ops = list(sample_ops)
        self.batch_ops = list(batch_ops)
        self.decode_size = decode_size

    @property
    def prefix_length(self) -> int:
        """How many leading sample ops are deterministic (the part :meth:`prefix` applies)."""
        count = 0
        for op in self.sample_ops:
            if not op.deterministic:
                break
            count += 1
        return count

    def prefix_size(self) -> Optional[Tuple[int, int]]:
        """``(height, width)`` every image has after :meth:`prefix`, or None when that size
        depends on the image (no leading resize or crop to a fixed size)."""
        length = self.prefix_length
        return getattr(self.sample_ops[length - 1], "size", None) if length else None

    def prefix_signature(self) -> Tuple:
        """What :meth:`prefix` computes: the decode size and the prefix ops (two pipelines with the
        same signature give the same prefix output, so they can share an image cache)."""
        return (self.decode_size, tuple(repr(op) for op in self.sample_ops[:self.prefix_length]))

    def prefix(self, img) -> np.ndarray:
        """Apply the leading deterministic ops; return the (H, W, 3) uint8 array that
        ``pipeline(prefix_output, rng, from_prefix=True)`` continues from."""
        for op in self.sample_ops[:self.prefix_length]:
            img = op(convert(img, op.input_kind))
        return to_array(img)

    def __call__(self, img, rng: Optional[np.random.Generator] = None, from_prefix: bool = False) -> torch.Tensor:
        """Transform one image.

        Args:
            img: a PIL image (or HWC uint8 array / CHW uint8 tensor).
            rng: the generator all random ops of this image draw from.
            from_prefix: ``img`` is the output of :meth:`prefix`: skip those ops.
        Returns:
            A contiguous (3, H, W) uint8 tensor.
        """
        for op in self.sample_ops[self.prefix_length if from_prefix else 0:]:
            img = op(convert(img, op.input_kind), rng)
        return to_tensor(img)

    def apply_batch(self, images: torch.Tensor,
                    rng: Optional[np.random.Generator] = None) -> torch.Tensor:
        """Apply the batch ops to a (B, 3, H, W) uint8 batch and return it."""
        for op in self.batch_ops:
            images = op(images, rng)
        return images

    def __repr__(self) -> str:
        lines = [f"  {op!r}" for op in self.sample_ops]
        lines += [f"  [batch] {op!r}" for op in self.batch_ops]
        return "AugmentationPipeline(\n" + "\n".join(lines) + "\n)"
