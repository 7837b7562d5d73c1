"""Tests of the train / test loaders, the device prefetcher and read_image (tiny JPEG data)."""

import itertools
import os

import numpy as np
import pytest
import torch
from PIL import Image

from reid_engine.config import get_cfg
from reid_engine.data import DevicePrefetcher, build_reid_test_loader, build_reid_train_loader, read_image
from reid_engine.data import build as build_module
from reid_engine.data.build import check_data_config
from reid_engine.data.common import ImageReadError
from reid_engine.utils.errors import ReidUserError
from reid_engine.utils.registry import UnknownChoiceError

IDS, PER_ID = 6, 4


def _write(path, seed, size=(16, 32)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, quality=90)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """An ImageFolder dataset 'tiny': 6 train ids x 4 images over 2 cameras; query/gallery."""
    root = tmp_path_factory.mktemp("reid_data")
    seed = itertools.count()
    for pid in range(1, IDS + 1):
        for i in range(PER_ID):
            _write(str(root / "tiny" / "train" / f"{pid:03d}" / f"{pid:03d}_c{i % 2 + 1}_{i}.jpg"),
                   next(seed))
    for pid in range(1, 4):
        _write(str(root / "tiny" / "query" / f"{pid:03d}" / f"{pid:03d}_c1_q.jpg"), next(seed))
        for cam in (1, 2):
            _write(str(root / "tiny" / "gallery" / f"{pid:03d}" / f"{pid:03d}_c{cam}_g.jpg"),
                   next(seed))
    for pid in range(1, 4):  # a second, smaller training set "tiny2"
        for split, cams in (("train", (1, 2)), ("query", (1,)), ("gallery", (2,))):
            for cam in cams:
                _write(str(root / "tiny2" / split / f"{pid:03d}" / f"{pid:03d}_c{cam}_x.jpg"),
                       next(seed))
    return str(root)


def _cfg(root, workers=0, seed=5):
    cfg = get_cfg()
    cfg.DATASETS.ROOT = root
    cfg.DATASETS.NAMES = ("ImageFolder:tiny",)
    cfg.INPUT.SIZE_TRAIN = [32, 16]
    cfg.INPUT.SIZE_TEST = [32, 16]
    for key in ("FLIP", "PADDING", "REA", "RPT", "CJ"):
        cfg.INPUT[key].ENABLED = True
    cfg.INPUT.PADDING.SIZE = 2
    cfg.DATALOADER.SAMPLER_TRAIN = "NaiveIdentitySampler"
    cfg.DATALOADER.NUM_INSTANCE = 2
    cfg.DATALOADER.NUM_WORKERS = workers
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.TEST.IMS_PER_BATCH = 4
    cfg.SEED = seed
    return cfg


def _batches(loader, n):
    return list(itertools.islice(iter(loader), n))


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x["images"], y["images"]) and torch.equal(x["targets"], y["targets"])
        assert x["img_paths"] == y["img_paths"] and torch.equal(x["camids"], y["camids"])


@pytest.fixture(scope="module")
def reference(data_root):
    """Eight batches of an uninterrupted single-process loader."""
    return _batches(build_reid_train_loader(_cfg(data_root)), 8)


def test_train_batches_have_the_documented_layout(data_root, reference):
    loader = build_reid_train_loader(_cfg(data_root))
    assert loader.dataset.num_classes == IDS and loader.dataset.num_cameras == 2
    assert len(loader.dataset) == IDS * PER_ID
    batch = reference[0]
    assert set(batch) == {"images", "targets", "camids", "domains", "img_paths"}
    assert batch["domains"].dtype == torch.int64 and batch["domains"].tolist() == [0] * 4  # one source
    assert batch["images"].dtype == torch.uint8 and batch["images"].shape == (4, 3, 32, 16)
    assert batch["targets"].dtype == torch.int64 and batch["camids"].dtype == torch.int64
    assert len(batch["img_paths"]) == 4 and all(os.path.isfile(p) for p in batch["img_paths"])
    for b in reference:  # P x K = 2 ids x 2 images, labels match the folders
        t = b["targets"].tolist()
        assert t[0] == t[1] and t[2] == t[3] and t[0] != t[2]
        assert len({os.path.dirname(p) for p in b["img_paths"][:2]}) == 1


def test_resume_continues_stream_with_workers(data_root, reference):
    first = build_reid_train_loader(_cfg(data_root))
    _batches(first, 3)
    state = first.state_dict()
    assert state["num_batches"] == 3 and state["seed"] == 5
    # Resume in a loader with 2 worker processes: same indices, same augmentations.
    resumed = build_reid_train_loader(_cfg(data_root, workers=2))
    resumed.load_state_dict(state)
    iterator = iter(resumed)
    got = [next(iterator) for _ in range(5)]
    _assert_same(got, reference[3:8])
    # Workers have read ahead, but the state counts only batches handed out.
    assert resumed.state_dict()["num_batches"] == 8
    with pytest.raises(RuntimeError, match="before iterating"):
        resumed.load_state_dict(state)
    resumed.close()


def test_two_worker_stream_equals_single_process(data_root, reference):
    loader = build_reid_train_loader(_cfg(data_root, workers=2))
    _assert_same(_batches(loader, 3), reference[:3])
    assert loader.state_dict() == {"seed": 5, "num_batches": 3, "batch_size": 4, "world_size": 1}
    loader.close()


def test_set_reweight_over_merged_training_sets(data_root):
    cfg = _cfg(data_root)
    cfg.DATASETS.NAMES = ("ImageFolder:tiny", "ImageFolder:tiny2")
    cfg.DATALOADER.SAMPLER_TRAIN = "SetReWeightSampler"
    cfg.DATALOADER.SET_WEIGHT = [1.0, 1.0]
    loader = build_reid_train_loader(cfg)
    assert loader.dataset.num_classes == IDS + 3 and loader.dataset.num_cameras == 4
    for batch in _batches(loader, 6):  # one id of each set per 2 x 2 batch
        t = batch["targets"].tolist()
        assert t[0] == t[1] and t[2] == t[3] and sorted([t[0] < IDS, t[2] < IDS]) == [0, 1]


def test_random_seed_is_kept_in_the_state(data_root):
    cfg = _cfg(data_root, seed=-1)
    first = build_reid_train_loader(cfg)
    whole = _batches(first, 4)
    state = first.state_dict()
    partial = build_reid_train_loader(cfg)
    partial.load_state_dict({**state, "num_batches": 2})
    _assert_same(_batches(partial, 2), whole[2:])
    with pytest.raises(ValueError, match="IMS_PER_BATCH"):
        build_reid_train_loader(cfg).load_state_dict({**state, "batch_size": 8})


def test_prefetcher_moves_batches_and_counts_handed_out(data_root, reference):
    loader = build_reid_train_loader(_cfg(data_root))
    prefetcher = DevicePrefetcher(loader, "cpu")
    assert prefetcher.dataset is loader.dataset
    got = list(itertools.islice(iter(prefetcher), 3))
    _assert_same(got, reference[:3])
    assert loader.state_dict()["num_batches"] == 4  # one batch held ahead
    state = prefetcher.state_dict()
    assert state["num_batches"] == 3
    resumed = DevicePrefetcher(build_reid_train_loader(_cfg(data_root)), "cpu")
    resumed.load_state_dict(state)
    _assert_same(list(itertools.islice(iter(resumed), 2)), reference[3:5])
    test_loader, _ = build_reid_test_loader(_cfg(data_root), "ImageFolder:tiny")
    assert not hasattr(DevicePrefetcher(test_loader, "cpu"), "state_dict")
    assert len(list(DevicePrefetcher(test_loader, "cpu"))) == len(list(test_loader))


def test_test_loader_query_first_and_shards(data_root, monkeypatch):
    cfg = _cfg(data_root)
    loader, num_query = build_reid_test_loader(cfg, "ImageFolder:tiny")
    batches = list(loader)
    paths = sum((b["img_paths"] for b in batches), [])
    assert num_query == 3 and len(paths) == 9
    assert all("query" in p for p in paths[:3]) and all("gallery" in p for p in paths[3:])
    images = torch.cat([b["images"] for b in batches])
    assert images.shape == (9, 3, 32, 16) and images.dtype == torch.uint8
    # Deterministic test transforms: two passes give the same pixels.
    assert torch.equal(images, torch.cat([b["images"] for b in loader]))
    monkeypatch.setattr(build_module.comm, "get_world_size", lambda: 2)
    monkeypatch.setattr(build_module.comm, "get_rank", lambda: 1)
    shard, _ = build_reid_test_loader(cfg, "ImageFolder:tiny")
    shard_paths = sum((b["img_paths"] for b in shard), [])
    assert shard_paths == paths[5:] and len(next(iter(shard))["targets"]) == 2


def test_batch_size_errors_name_the_keys(data_root):
    cfg = _cfg(data_root)
    cfg.SOLVER.IMS_PER_BATCH = 6
    cfg.DATALOADER.NUM_INSTANCE = 4
    with pytest.raises(ReidUserError, match="NUM_INSTANCE"):
        build_reid_train_loader(cfg)
    cfg.DATALOADER.SAMPLER_TRAIN = "NoSuchSampler"
    with pytest.raises(UnknownChoiceError, match="unknown DATALOADER.SAMPLER_TRAIN 'NoSuchSampler': "
                                                 "choose one of .*NaiveIdentitySampler"):
        build_reid_train_loader(cfg)


@pytest.mark.parametrize("key, value, message", [
    ("DATASETS.NAMES", ("Market",), "unknown DATASETS.NAMES 'Market'.*did you mean Market1501[?]; for your own"),
    ("DATASETS.TESTS", ("VeRI",), "unknown DATASETS.TESTS 'VeRI'.*did you mean VeRi[?]"),
    ("DATASETS.TESTS", ("Market1501:x",), "DATASETS.TESTS: dataset 'Market1501' takes no ':<value>'"),
    ("DATALOADER.SAMPLER_TRAIN", "Naive", "unknown DATALOADER.SAMPLER_TRAIN 'Naive'.*did you mean NaiveIdentitySampler[?]"),
])
def test_check_data_config_reads_no_data(tmp_path, key, value, message):
    cfg = get_cfg()
    cfg.DATASETS.ROOT = str(tmp_path / "missing")  # nothing is read from it
    cfg.DATASETS.NAMES = ("ImageFolder:tiny",)
    check_data_config(cfg)
    section, field = key.split(".")
    cfg[section][field] = value
    with pytest.raises(ReidUserError, match=message):
        check_data_config(cfg)


def test_read_image_converts_and_names_bad_files(tmp_path):
    grey = tmp_path / "grey.png"
    Image.new("L", (8, 16), 77).save(grey)
    img = read_image(str(grey))
    assert img.mode == "RGB" and img.size == (8, 16) and img.getpixel((0, 0)) == (77, 77, 77)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a jpeg at all")
    with pytest.raises(ImageReadError, match="bad.jpg") as err:
        read_image(str(bad))
    assert "\n" not in str(err.value)
    with pytest.raises(ImageReadError, match="missing.jpg"):
        read_image(str(tmp_path / "missing.jpg"))


def test_corrupt_image_in_worker_names_its_path(tmp_path):
    root = tmp_path / "data"
    for pid in (1, 2):
        for i in range(2):
            _write(str(root / "t" / "train" / f"{pid}" / f"{pid}_c{i + 1}_{i}.jpg"), pid * 10 + i)
        _write(str(root / "t" / "query" / f"{pid}" / f"{pid}_c1_q.jpg"), pid)
        _write(str(root / "t" / "gallery" / f"{pid}" / f"{pid}_c2_g.jpg"), pid + 5)
    (root / "t" / "train" / "2" / "2_c1_0.jpg").write_bytes(b"\xff\xd8 truncated")
    cfg = _cfg(str(root), workers=1)
    cfg.DATASETS.NAMES = ("ImageFolder:t",)
    cfg.DATALOADER.SAMPLER_TRAIN = "TrainingSampler"
    loader = build_reid_train_loader(cfg)
    with pytest.raises(ImageReadError, match="2_c1_0.jpg"):
        _batches(loader, 2)
    loader.close()
