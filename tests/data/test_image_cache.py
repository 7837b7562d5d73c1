"""DATALOADER.CACHE_IMAGES: cached training samples are the bytes of decoded ones."""
import itertools
import logging
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from reid_engine.config import ConfigError, get_cfg
from reid_engine.data import build_reid_inference_loader, build_reid_train_loader, build_transforms
from reid_engine.data import image_cache as image_cache_module
from reid_engine.data.build import check_data_config
from reid_engine.data.image_cache import ImageCache, build_image_cache
from reid_engine.utils.registry import UnknownChoiceError

IDS, PER_ID = 4, 4


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """ImageFolder 'cached': 4 ids x 4 training images of 20x40 (resized to 12x24 by the tests), 2 cameras."""
    root = tmp_path_factory.mktemp("cache_data")
    seed = itertools.count()
    files = [("train", pid, f"c{i % 2 + 1}_{i}") for pid in range(1, IDS + 1) for i in range(PER_ID)]
    files += [(split, 1, f"{cam}_0") for split, cam in (("query", "c1"), ("gallery", "c2"))]
    for split, pid, name in files:
        path = root / "cached" / split / f"{pid:03d}" / f"{pid:03d}_{name}.jpg"
        os.makedirs(path.parent, exist_ok=True)
        pixels = np.random.default_rng(next(seed)).integers(0, 256, (40, 20, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path, quality=90)
    return root


def _cfg(root, cache, workers=0):
    cfg = get_cfg()
    cfg.DATASETS.ROOT = str(root)
    cfg.DATASETS.NAMES = ("ImageFolder:cached",)
    cfg.INPUT.SIZE_TRAIN = [24, 12]
    for key in ("FLIP", "PADDING", "REA", "CJ"):  # random ops after the resize, colour jitter on arrays
        cfg.INPUT[key].ENABLED = True
    cfg.INPUT.PADDING.SIZE = 2
    cfg.DATALOADER.SAMPLER_TRAIN = "NaiveIdentitySampler"
    cfg.DATALOADER.NUM_INSTANCE = 2
    cfg.DATALOADER.NUM_WORKERS = workers
    cfg.DATALOADER.CACHE_IMAGES = cache
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.SEED = 3
    return cfg


def _batches(cfg, n=10):
    """``n`` batches (2.5 epochs: cached images are used again after the random ops read them)."""
    loader = build_reid_train_loader(cfg)
    batches = list(itertools.islice(iter(loader), n))
    loader.close()
    return loader, batches


def test_cached_batches_equal_decoded_ones_in_process_and_in_a_worker(data_root):
    plain, reference = _batches(_cfg(data_root, "off"))
    assert plain.dataset.cache is None
    for workers in (0, 1):
        loader, got = _batches(_cfg(data_root, "on", workers))
        cache = loader.dataset.cache
        assert isinstance(cache, ImageCache) and len(cache) == IDS * PER_ID and cache.filled.all()
        assert cache.pixels.shape == (IDS * PER_ID, 24, 12, 3)
        for a, b in zip(reference, got):
            assert torch.equal(a["images"], b["images"]) and a["img_paths"] == b["img_paths"]
    # The cache holds the resized image itself: the test pipeline's resize of the same file.
    path = reference[0]["img_paths"][0]
    resized = np.asarray(Image.open(path).convert("RGB").resize((12, 24), Image.BICUBIC))
    np.testing.assert_array_equal(cache.lookup(path), resized)


def test_cached_views_are_read_only(data_root):
    loader = build_reid_train_loader(_cfg(data_root, "on"))
    view = loader.dataset.cache.lookup(loader.dataset.items[0][0])
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0, 0] = 1
    assert loader.dataset.cache.lookup("not/a/training/image.jpg") is None


def test_unreadable_image_stays_uncached_and_is_skipped_as_before(tmp_path, data_root):
    root = tmp_path / "root"  # a copy of the set where one image is truncated
    shutil.copytree(data_root / "cached", root / "cached")
    bad = root / "cached" / "train" / "001" / "001_c1_0.jpg"
    bad.write_bytes(bad.read_bytes()[:60])
    cfg = _cfg(root, "on")
    cfg.DATALOADER.ON_BAD_IMAGE = "skip"
    loader, batches = _batches(cfg, 8)
    assert loader.dataset.cache.lookup(str(bad)) is None
    assert int(loader.dataset.cache.filled.sum()) == IDS * PER_ID - 1
    assert str(bad) not in [p for b in batches for p in b["img_paths"]]
    assert loader.bad_images.count >= 1 and loader.bad_images.first[0] == str(bad)


def test_auto_caches_within_the_memory_share_and_says_why_not(data_root, monkeypatch, caplog):
    pipeline = build_transforms(_cfg(data_root, "auto"), is_train=True)
    paths = [str(p) for p in sorted((data_root / "cached" / "train").rglob("*.jpg"))]
    need = ImageCache.bytes_needed(len(paths), (24, 12))
    monkeypatch.setattr(image_cache_module, "available_memory", lambda: 4 * need)
    assert build_image_cache(_cfg(data_root, "auto"), paths, pipeline) is not None
    monkeypatch.setattr(image_cache_module, "available_memory", lambda: 4 * need - 1)
    with caplog.at_level(logging.INFO, logger="reid_engine.data.image_cache"):
        assert build_image_cache(_cfg(data_root, "auto"), paths, pipeline) is None
    assert "Image cache: off" in caplog.text and "set it to on" in caplog.text
    assert build_image_cache(_cfg(data_root, "on"), paths, pipeline) is not None  # on ignores the share
    assert build_image_cache(_cfg(data_root, "off"), paths, pipeline) is None


def test_a_pipeline_without_a_fixed_size_start_is_not_cached(data_root):
    cfg = _cfg(data_root, "auto")
    cfg.INPUT.AUTOAUG.ENABLED = True  # random, before the resize: nothing to cache
    pipeline = build_transforms(cfg, is_train=True)
    assert pipeline.prefix_length == 0 and pipeline.prefix_size() is None
    assert build_image_cache(cfg, ["x.jpg"], pipeline) is None
    cfg.DATALOADER.CACHE_IMAGES = "on"
    with pytest.raises(ConfigError, match="CACHE_IMAGES on needs"):
        build_image_cache(cfg, ["x.jpg"], pipeline)
    test_pipeline = build_transforms(_cfg(data_root, "auto"), is_train=False)
    assert test_pipeline.prefix_length == len(test_pipeline.sample_ops) and test_pipeline.prefix_size() == (256, 128)


def test_a_wrong_value_is_a_one_line_error_with_the_closest_choice(data_root):
    with pytest.raises(UnknownChoiceError, match="DATALOADER.CACHE_IMAGES 'one'.*did you mean on"):
        check_data_config(_cfg(data_root, "one"))


def test_a_test_pipeline_with_the_same_resize_reads_the_training_cache(data_root):
    """The label-free hook extracts training features through the training cache."""
    cfg = _cfg(data_root, "on")
    cfg.INPUT.SIZE_TEST = [24, 12]
    train = build_reid_train_loader(cfg)
    items = train.dataset.items
    cached = build_reid_inference_loader(cfg, items, cache=train.dataset.cache)
    assert cached.dataset.cache is train.dataset.cache
    plain = build_reid_inference_loader(cfg, items)
    for a, b in zip(plain, cached):
        assert torch.equal(a["images"], b["images"])
    cfg.INPUT.SIZE_TEST = [32, 16]  # another prefix: the cache does not serve it
    assert build_reid_inference_loader(cfg, items, cache=train.dataset.cache).dataset.cache is None
