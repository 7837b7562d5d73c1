"""Tracklet sampling (evenly / random / all), augmentation shared by a tracklet's frames, and the B x T batch layout."""

import os

import numpy as np
import pytest
import torch
from PIL import Image

from reid_engine.config import ConfigError, get_cfg
from reid_engine.data.build import build_tracklet_inference_loader, check_tracklet_config, collate_samples
from reid_engine.data.tracklets import TrackletItemSet, TrainTrackletSet, sample_frame_indices
from reid_engine.data.transforms import build_transforms
from reid_engine.utils.errors import ReidUserError


def test_evenly_follows_torchreid():
    assert sample_frame_indices(10, 4, "evenly") == [0, 2, 4, 6]  # 10 mod 4 = 2 dropped, step 2
    assert sample_frame_indices(8, 4, "evenly") == [0, 2, 4, 6]
    assert sample_frame_indices(4, 4, "evenly") == [0, 1, 2, 3]
    assert sample_frame_indices(3, 5, "evenly") == [0, 1, 2, 2, 2]  # the last frame repeated


def test_random_and_all():
    rng = np.random.default_rng(0)
    for _ in range(20):
        idx = sample_frame_indices(10, 4, "random", rng)
        assert idx == sorted(idx) and len(set(idx)) == 4 and all(0 <= i < 10 for i in idx)
    short = sample_frame_indices(2, 5, "random", rng)  # with replacement when too short
    assert len(short) == 5 and short == sorted(short) and set(short) <= {0, 1}
    assert sample_frame_indices(7, 4, "all") == list(range(7))


def _frames(tmp_path, n, size=(16, 32)):
    """n PNG frames whose pixels all equal the frame number (x 10)."""
    paths = []
    for t in range(n):
        path = os.path.join(str(tmp_path), f"f{t}.png")
        Image.new("RGB", size, (10 * t, 10 * t, 10 * t)).save(path)
        paths.append(path)
    return tuple(paths)


def _cfg(**overrides):
    cfg = get_cfg()
    cfg.INPUT.SIZE_TRAIN = cfg.INPUT.SIZE_TEST = [32, 16]
    cfg.INPUT.FLIP.ENABLED = True
    cfg.INPUT.FLIP.PROB = 0.5
    cfg.INPUT.PADDING.ENABLED = True
    cfg.INPUT.PADDING.SIZE = 4
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.INPUT.SEQ_LEN = 3
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


def test_train_tracklet_samples_share_augmentation(tmp_path):
    paths = _frames(tmp_path, 6)
    cfg = _cfg()
    data = TrainTrackletSet([(paths, 0, 0)], build_transforms(cfg, is_train=True), 1, 1, seq_len=3, method="random")
    for position in range(8):
        sample = data[(0, (5, 0, position))]
        frames = sample["image"]
        assert frames.shape == (3, 3, 32, 16) and frames.dtype == torch.uint8
        values = [int(f.max()) for f in frames]  # the frame numbers that were picked, in order
        assert values == sorted(values)
        # same crop / flip for all frames: the padded border sits at the same place in each
        zero_masks = [(f == 0).all(0) for f in frames if int(f.max()) > 0]
        assert all(torch.equal(zero_masks[0], m) for m in zero_masks)
        assert torch.equal(sample["image"], data[(0, (5, 0, position))]["image"])  # reproducible


def test_batch_layout_is_b_by_t(tmp_path):
    paths = _frames(tmp_path, 5)
    cfg = _cfg()
    items = [(paths, 3, 0), (paths[:2], 4, 1)]
    loader = build_tracklet_inference_loader(cfg, items)
    batch = next(iter(loader))
    assert batch["images"].shape == (2, 3, 3, 32, 16)
    assert batch["targets"].tolist() == [3, 4] and batch["camids"].tolist() == [0, 1]
    assert batch["img_paths"] == [paths[0], paths[0]]
    # evenly with seq_len 3: frames 0, 1, 2 of the first; 0, 1, 1 (last repeated) of the second
    assert [int(f.max()) for f in batch["images"][1]] == [0, 10, 10]
    cfg.TEST.SAMPLE_METHOD = "all"  # variable lengths: one tracklet per batch
    shapes = [b["images"].shape for b in build_tracklet_inference_loader(cfg, items)]
    assert shapes == [(1, 5, 3, 32, 16), (1, 2, 3, 32, 16)]
    samples = [TrackletItemSet(items, build_transforms(cfg, is_train=False), 3, "evenly")[i] for i in range(2)]
    assert collate_samples(samples)["images"].shape == (2, 3, 3, 32, 16)


def test_sample_method_keys_are_checked():
    with pytest.raises(ConfigError, match="INPUT.SAMPLE_METHOD 'all'"):
        check_tracklet_config(_cfg(INPUT__SAMPLE_METHOD="all"))
    with pytest.raises(ReidUserError, match="TEST.SAMPLE_METHOD"):
        check_tracklet_config(_cfg(TEST__SAMPLE_METHOD="evenlyy"))
    with pytest.raises(ConfigError, match="INPUT.SEQ_LEN"):
        check_tracklet_config(_cfg(INPUT__SEQ_LEN=0))
