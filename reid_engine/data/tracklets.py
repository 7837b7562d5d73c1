"""Tracklets as samples: choosing the frames of a tracklet and the torch datasets that decode them.

A tracklet sample is ``{"image": (T, 3, H, W) uint8, "target", "camid", "img_path"}``
(``img_path`` = its first frame), so :func:`~reid_engine.data.build.collate_samples`
stacks a batch into (B, T, 3, H, W). Every frame of one sample gets the same augmentation
(the sample's generator is rewound before each frame), so a flip or crop never differs
inside a tracklet.
"""

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from reid_engine.utils.registry import check_choice

from .common import ImageItemSet, TrainImageSet, read_image

__all__ = ["SAMPLE_METHODS", "TRAIN_SAMPLE_METHODS", "sample_frame_indices", "TrackletItemSet",
           "TrainTrackletSet", "is_tracklet_item", "representative_frame"]

Tracklet = Tuple[Tuple[str, ...], int, int]

#: accepted TEST.SAMPLE_METHOD values (torchreid's names)
SAMPLE_METHODS = ("evenly", "random", "all")
#: accepted INPUT.SAMPLE_METHOD values: a training batch needs one length for all tracklets
TRAIN_SAMPLE_METHODS = ("evenly", "random")


def is_tracklet_item(item: Sequence[Any]) -> bool:
    """Whether an item ``(path or frame paths, pid, camid)`` is a tracklet (its first field a sequence of frames)."""
    return not isinstance(item[0], (str, bytes, os.PathLike))


def representative_frame(path_or_frames) -> str:
    """The frame that stands for an item in pictures: the image itself, or a tracklet's middle frame."""
    if isinstance(path_or_frames, (str, bytes, os.PathLike)):
        return path_or_frames
    return path_or_frames[(len(path_or_frames) - 1) // 2]


def sample_frame_indices(num_frames: int, seq_len: int, method: str,
                         rng: Optional[np.random.Generator] = None) -> List[int]:
    """The frame indices torchreid's VideoDataset takes from a tracklet of ``num_frames`` frames.

    Args:
        num_frames: frames in the tracklet (>= 1).
        seq_len: frames to take (INPUT.SEQ_LEN); ignored by ``"all"``.
        method: ``"evenly"``: with n >= seq_len drop the last n mod seq_len frames and take
            every (n // seq_len)-th from the first; with fewer, every frame and the last one
            repeated. ``"random"``: seq_len distinct indices (with replacement when the
            tracklet is shorter), sorted. ``"all"``: every frame.
        rng: the generator of ``"random"``.
    Returns:
        The indices in temporal order.
    """
    check_choice(method, SAMPLE_METHODS, "TEST.SAMPLE_METHOD")
    if method == "all":
        return list(range(num_frames))
    if method == "evenly":
        if num_frames >= seq_len:
            step = num_frames // seq_len
            return list(range(0, step * seq_len, step))
        return list(range(num_frames)) + [num_frames - 1] * (seq_len - num_frames)
    if rng is None:
        raise ValueError("sample_frame_indices: the 'random' method needs a generator")
    chosen = rng.choice(num_frames, size=seq_len, replace=num_frames < seq_len)
    return sorted(int(i) for i in chosen)


def load_tracklet(item: Tracklet, transform, seq_len: int, method: str,
                  rng: Optional[np.random.Generator], index: int) -> Dict[str, Any]:
    """Decode and transform the chosen frames of one tracklet.

    Args:
        item: ``(frame paths, pid, camid)``.
        transform: the image pipeline.
        seq_len, method: see :func:`sample_frame_indices`.
        rng: the sample's generator (training), or None (test: ``"random"`` then draws
            from a generator seeded by ``index``, so a test run is reproducible).
        index: the item's position (seeds the test-time ``"random"`` draw).
    Returns:
        The sample dict with ``"image"`` (T, 3, H, W) uint8.
    """
    paths, pid, camid = item
    frame_rng = rng if rng is not None else np.random.default_rng([index, 3])
    chosen = sample_frame_indices(len(paths), seq_len, method, frame_rng)
    state = rng.bit_generator.state if rng is not None else None
    draft = getattr(transform, "decode_size", None)  # None for test pipelines: full-size decodes
    frames = []
    for i in chosen:
        if state is not None:
            rng.bit_generator.state = state  # the same augmentation draws for every frame
        frames.append(transform(read_image(paths[i], draft), rng))
    return {"image": torch.stack(frames), "target": pid, "camid": camid, "img_path": paths[0]}


class TrackletItemSet(ImageItemSet):
    """Test-time dataset of tracklets: ``dataset[i]`` is a (T, 3, H, W) sample.

    Args:
        items: ``(frame paths, pid, camid)`` tracklets.
        transform: the test pipeline.
        seq_len: INPUT.SEQ_LEN.
        method: TEST.SAMPLE_METHOD.
    """

    def __init__(self, items: Sequence[Tracklet], transform, seq_len: int, method: str):
        super().__init__(items, transform)
        self.seq_len, self.method = int(seq_len), method

    def load(self, index: int, rng: Optional[np.random.Generator]) -> Dict[str, Any]:
        """The sample of tracklet ``index`` (see :func:`load_tracklet`)."""
        return load_tracklet(self.items[index], self.transform, self.seq_len, self.method, rng, index)


class TrainTrackletSet(TrainImageSet):
    """Training dataset of tracklets, keyed like :class:`TrainImageSet`; samples are (T, 3, H, W).

    Args:
        items, transform, num_classes, num_cameras, domains: as :class:`TrainImageSet`.
        options: ``domain_names`` and ``on_bad_image`` of :class:`TrainImageSet` (a tracklet
            with an unreadable frame is replaced by another tracklet of its identity).
        seq_len: INPUT.SEQ_LEN.
        method: INPUT.SAMPLE_METHOD (``"evenly"`` or ``"random"``).
    """

    def __init__(self, items: Sequence[Tracklet], transform, num_classes: int, num_cameras: int,
                 domains: Optional[Sequence[int]] = None, *, seq_len: int, method: str, **options):
        check_choice(method, TRAIN_SAMPLE_METHODS, "INPUT.SAMPLE_METHOD")
        super().__init__(items, transform, num_classes, num_cameras, domains=domains, **options)
        self.seq_len, self.method = int(seq_len), method

    def load(self, index: int, rng: Optional[np.random.Generator]) -> Dict[str, Any]:
        """The sample of tracklet ``index`` (see :func:`load_tracklet`)."""
        return load_tracklet(self.items[index], self.transform, self.seq_len, self.method, rng, index)
