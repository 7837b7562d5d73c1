"""Flip, pad + random crop and random erasing as batched tensor ops on the training device.

With ``INPUT.DEVICE_AUGMENT`` on, the loader workers only decode and resize (plus the
photometric / affine ops that stay per image), and these three ops run here on the whole
(B, 3, H, W) uint8 batch, on the device the model trains on, just before the forward pass.
Each image draws its own parameters from the same distributions as the per-image ops
(:class:`RandomHorizontalFlip`, :class:`RandomPadCrop`, :class:`RandomErasing`), including
random erasing's 100 tries at a rectangle that fits. Tracklet batches (B, T, 3, H, W) draw
once per tracklet, so its frames are treated alike, as on the per-image path.

The draws come from one ``torch.Generator`` on the device, created once; its state is the
object's :meth:`BatchAugmentation.state_dict`, so a resumed run continues the same stream.
Everything is vectorised and device-agnostic (no host synchronisation, no Python loop over
images), and it runs outside any compiled model.
"""

import logging
import math
from typing import Any, Dict, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

from .erasing import RandomErasing
from .geometric import RandomHorizontalFlip, RandomPadCrop

__all__ = ["BatchAugmentation"]

logger = logging.getLogger(__name__)

#: tries at an erasing rectangle that fits, as sample_rectangle's default
_ERASING_ATTEMPTS = 100


def _uniform_int(u: torch.Tensor, count: Union[int, torch.Tensor]) -> torch.Tensor:
    """Map uniforms in [0, 1) to integers uniform in 0 .. count - 1 (count >= 1: an int, or a
    tensor of counts on u's device; a float32 product can round up to count, hence the cap)."""
    index = (u * count).long()
    return torch.minimum(index, count - 1) if isinstance(count, torch.Tensor) else index.clamp_(max=count - 1)


def _source_index(pos: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """Map positions relative to the image (negative or >= size: in the padding) to image
    indices, as ``np.pad`` fills "edge", "reflect" and "symmetric" padding."""
    if mode == "edge" or size == 1:
        return pos.clamp(0, size - 1)
    if mode == "reflect":  # mirrored about the edge pixels: period 2 (size - 1)
        period = 2 * (size - 1)
        pos = pos.remainder(period)
        return torch.where(pos >= size, period - pos, pos)
    period = 2 * size  # symmetric: mirrored with the edge pixels repeated
    pos = pos.remainder(period)
    return torch.where(pos >= size, period - 1 - pos, pos)


def derived_seed(*values: int) -> int:
    """A 63-bit generator seed mixed from integers (numpy's SeedSequence: nearby inputs draw apart)."""
    words = np.random.SeedSequence([int(v) for v in values]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) | (int(words[1]) >> 1)


class BatchAugmentation:
    """Flip, pad + random crop and random erasing of a whole batch, on one device.

    Applied in the order of the per-image pipeline: pad-crop, flip, erasing.

    Args:
        device: where the batches are augmented (the training device).
        seed: this process's seed (derive it from the stream seed and the rank); each batch's draws
            come from a generator seeded with (seed, batch number), so a checkpoint needs only the
            batch count, which is the same on every rank.
        flip: the per-image flip whose probability is used, or None.
        pad_crop: the per-image pad + crop whose padding and mode are used, or None (the
            crop keeps the input size: the per-image path resizes to it first).
        erasing: the per-image random erasing whose probability, area range, aspect range
            and fill are used, or None.
    """

    def __init__(self, device: Union[str, torch.device], seed: int, flip: Optional[RandomHorizontalFlip] = None,
                 pad_crop: Optional[RandomPadCrop] = None, erasing: Optional[RandomErasing] = None):
        self.device = torch.device(device)
        self.seed = int(seed)
        self.steps = 0  # batches augmented so far
        self.generator = torch.Generator(device=self.device)
        self.flip, self.pad_crop, self.erasing = flip, pad_crop, erasing
        self._fill = None
        if erasing is not None:
            self._fill = torch.tensor([int(round(v)) for v in erasing.value], dtype=torch.uint8,
                                      device=self.device).view(1, 3, 1, 1)

    def __repr__(self) -> str:
        ops = [repr(op) for op in (self.pad_crop, self.flip, self.erasing) if op is not None]
        return f"BatchAugmentation(device={self.device}, {', '.join(ops)})"

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """Return ``batch`` with its images moved to the device (non-blocking) and augmented."""
        out = dict(batch)
        out["images"] = self.apply(batch["images"].to(self.device, non_blocking=True))
        return out

    def _rand(self, *shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator, device=self.device)

    def apply(self, images: torch.Tensor) -> torch.Tensor:
        """Augment (B, C, H, W) images, or (B, T, C, H, W) tracklets with one draw per tracklet.

        Args:
            images: a batch on this object's device (uint8 0..255, or float on the same scale).
        Returns:
            A new tensor of the same shape and dtype (the input is not modified).
        """
        if images.device != self.device:
            raise ValueError(f"BatchAugmentation on {self.device} got images on {images.device}; "
                             f"call it on the batch dict (it moves the images) or move them first")
        self.generator.manual_seed(derived_seed(self.seed, self.steps))
        self.steps += 1
        frames = images.shape[1] if images.dim() == 5 else 1
        flat = images.flatten(0, 1) if images.dim() == 5 else images
        out = self._pad_crop_flip(flat, images.shape[0], frames)
        if self.erasing is not None:
            out = self._erase(out, images.shape[0], frames)
        return out.view(images.shape)

    def _pad_crop_flip(self, images: torch.Tensor, batch: int, frames: int) -> torch.Tensor:
        """Crop each image from its padded canvas and mirror it: an index_select of whole rows,
        then one gather along the columns (crop and flip in the same index)."""
        if self.pad_crop is None and self.flip is None:
            return images
        n, channels, height, width = images.shape
        source = images.contiguous()
        rows = torch.arange(height, device=self.device).expand(batch, height)
        cols = torch.arange(width, device=self.device).expand(batch, width)
        if self.pad_crop is not None:
            pad, mode = self.pad_crop.padding, self.pad_crop.mode
            # The crop keeps the input size, so the window starts anywhere in 0 .. 2 * pad.
            top = _uniform_int(self._rand(batch), 2 * pad + 1)[:, None]
            left = _uniform_int(self._rand(batch), 2 * pad + 1)[:, None]
            if mode == "constant":  # zeros: index into the padded canvas itself
                source = F.pad(source, (pad, pad, pad, pad))
                rows, cols = rows + top, cols + left
            else:
                rows = _source_index(rows + top - pad, height, mode)
                cols = _source_index(cols + left - pad, width, mode)
        if self.flip is not None:
            cols = torch.where((self._rand(batch) < self.flip.p)[:, None], cols.flip(1), cols)
        if frames > 1:  # one draw per tracklet, shared by its frames
            rows, cols = rows.repeat_interleave(frames, 0), cols.repeat_interleave(frames, 0)
        src_height, src_width = source.shape[-2:]
        out = source
        if self.pad_crop is not None:
            planes = torch.arange(n * channels, device=self.device).view(n, channels, 1) * src_height
            index = (planes + rows[:, None, :]).reshape(-1)
            out = source.view(-1, src_width).index_select(0, index).view(n, channels, height, src_width)
        return out.gather(3, cols[:, None, None, :].expand(n, channels, height, width))

    def _erase(self, images: torch.Tensor, batch: int, frames: int) -> torch.Tensor:
        """Random erasing: up to 100 tries per image, drawn together; the first that fits is used."""
        op = self.erasing
        _, _, height, width = images.shape
        area = height * width
        apply = self._rand(batch) < op.p
        fraction = op.scale[0] + (op.scale[1] - op.scale[0]) * self._rand(batch, _ERASING_ATTEMPTS)
        log_lo, log_hi = math.log(op.ratio[0]), math.log(op.ratio[1])
        aspect = torch.exp(log_lo + (log_hi - log_lo) * self._rand(batch, _ERASING_ATTEMPTS))
        target = area * fraction
        h = torch.sqrt(target * aspect).round().long()
        w = torch.sqrt(target / aspect).round().long()
        erased = h * w
        # The same acceptance as sample_rectangle: it fits, and the rounded area is in range.
        fits = (h > 0) & (h < height) & (w > 0) & (w < width) & \
            (erased >= op.scale[0] * area) & (erased <= op.scale[1] * area)
        first = fits.int().argmax(dim=1, keepdim=True)  # the first try that fits (argmax: the first maximum)
        apply &= fits.any(dim=1)
        h, w = h.gather(1, first).squeeze(1), w.gather(1, first).squeeze(1)
        top = _uniform_int(self._rand(batch), height - h + 1)
        left = _uniform_int(self._rand(batch), width - w + 1)
        ys = torch.arange(height, device=self.device)
        xs = torch.arange(width, device=self.device)
        in_rows = (ys >= top[:, None]) & (ys < (top + h)[:, None]) & apply[:, None]
        in_cols = (xs >= left[:, None]) & (xs < (left + w)[:, None])
        if frames > 1:
            in_rows, in_cols = in_rows.repeat_interleave(frames, 0), in_cols.repeat_interleave(frames, 0)
        # Arithmetic masks (a product of 0 / 1 rows and columns): torch.where with broadcasting
        # is several times slower on the CPU.
        mask = in_rows[:, None, :, None].to(images.dtype) * in_cols[:, None, None, :].to(images.dtype)
        return torch.addcmul(images * (1 - mask), self._fill.to(images.dtype), mask)

    def state_dict(self) -> Dict[str, Any]:
        """``{"steps": batches augmented, "device_type": str}``: where the draws stand. The same on
        every rank (each rank's own seed is not in it), so the main process's copy resumes them all."""
        return {"steps": self.steps, "device_type": self.device.type}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue the draws saved by :meth:`state_dict` with this process's own seed.

        An older checkpoint holds one generator's state (the main process's): loading it into
        every rank would make the ranks draw alike, so the draws restart from the seeds instead,
        with a warning.
        """
        if "steps" in state:
            self.steps = int(state["steps"])
            return
        logger.warning("The checkpoint's batched augmentation state is from an older version (one "
                       "generator for every rank): the draws restart from this run's seeds (not an exact resume)")

