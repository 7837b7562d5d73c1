"""An unreadable training image (corrupt, truncated or missing) mid-training: with
DATALOADER.ON_BAD_IMAGE error (default) one line naming the file, the training set and the
index, also through loader worker processes; with skip, another image of the same identity
takes its place (the P x K batch holds) and the count and the first paths are logged."""
import itertools
import logging
import os
import re

import numpy as np
import pytest
from PIL import Image

from reid_engine.config import get_cfg
from reid_engine.data import build as build_module
from reid_engine.data.build import build_reid_train_loader, check_data_config
from reid_engine.data.common import ImageReadError
from reid_engine.utils.errors import ReidUserError
from tests.conftest import records_of

IDS, PER_ID = 4, 4


@pytest.fixture(scope="module")
def clean_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_image_data")
    seed = itertools.count()
    for split in ("train", "query", "gallery"):
        for pid in range(1, IDS + 1):
            for i in range(PER_ID if split == "train" else 1):
                cam = 2 if split == "gallery" else i % 2 + 1
                path = root / "tiny" / split / f"{pid:03d}" / f"{pid:03d}_c{cam}_{i}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                pixels = np.random.default_rng(next(seed)).integers(0, 256, (32, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(path, quality=90)
    return root


@pytest.fixture
def root(clean_root, tmp_path):
    """A private copy (hard links: the tests replace files, never write into them)."""
    copy = tmp_path / "data"
    for dirpath, _, files in os.walk(clean_root):
        target = copy / os.path.relpath(dirpath, clean_root)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.link(os.path.join(dirpath, name), target / name)
    return copy


@pytest.fixture
def loader_logs(caplog):
    with records_of(caplog, build_module.__name__):
        yield caplog


def _cfg(root, workers=0, policy="error"):
    cfg = get_cfg()
    cfg.DATASETS.ROOT = str(root)
    cfg.DATASETS.NAMES = ("ImageFolder:tiny",)
    cfg.INPUT.SIZE_TRAIN = [32, 16]
    cfg.INPUT.FLIP.ENABLED = True
    cfg.DATALOADER.SAMPLER_TRAIN = "NaiveIdentitySampler"
    cfg.DATALOADER.NUM_INSTANCE = 2
    cfg.DATALOADER.NUM_WORKERS = workers
    cfg.DATALOADER.ON_BAD_IMAGE = policy
    # Files break after the loader is built here (mid-training): a cache would hold their good copy.
    cfg.DATALOADER.CACHE_IMAGES = "off"
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.SEED = 3
    return cfg


def _first_batch(cfg, before_reading=lambda: None):
    """The loader's first batch, and the loader; `before_reading` runs after the dataset
    folder was scanned (a file that goes missing then is missing mid-training)."""
    loader = build_reid_train_loader(cfg)
    before_reading()
    try:
        return next(iter(loader)), loader
    finally:
        loader.close()


def _break(path, how):
    path.unlink()  # a hard link: the shared original stays intact
    if how == "corrupt":
        path.write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", ["corrupt", "missing"])
def test_error_names_file_dataset_and_index(root, workers, how):
    clean, loader = _first_batch(_cfg(root))
    victim = clean["img_paths"][1]
    index = [item[0] for item in loader.dataset.items].index(victim)
    with pytest.raises(ImageReadError) as err:
        _first_batch(_cfg(root, workers), lambda: _break(root / os.path.relpath(victim, root), how))
    message = str(err.value)
    assert isinstance(err.value, ReidUserError) and "\n" not in message, message
    assert f"cannot read image '{victim}'" in message
    assert f"training item {index} (ImageFolder:tiny)" in message
    assert "DATALOADER.ON_BAD_IMAGE skip" in message
    assert ("No such file" in message) == (how == "missing")
    # Through a worker process: the same class and line, plus where it happened.
    assert bool(re.search(r"\(in DataLoader worker process \d\)$", message)) == (workers > 0), message


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_replaces_by_the_same_identity_and_logs(root, loader_logs, workers):
    clean, _ = _first_batch(_cfg(root))
    victims = [clean["img_paths"][0], clean["img_paths"][3]]
    for victim in victims:
        _break(root / os.path.relpath(victim, root), "corrupt")
    batch, loader = _first_batch(_cfg(root, workers, policy="skip"))
    # P x K holds: the same identities, each image replaced by one of its own identity.
    assert batch["targets"].tolist() == clean["targets"].tolist()
    assert batch["images"].shape == clean["images"].shape and "bad_images" not in batch
    for victim in victims:
        assert victim not in batch["img_paths"]
    for pos in (0, 3):
        replaced = batch["img_paths"][pos]
        assert os.path.basename(os.path.dirname(replaced)) == os.path.basename(os.path.dirname(victims[pos // 3]))
    assert loader.bad_images.count == 2 and loader.bad_images.first == victims
    warnings = [r.getMessage() for r in loader_logs.records if r.levelno >= logging.WARNING]
    for victim in victims:
        assert any(f"cannot read image '{victim}'" in w and "replaced" in w for w in warnings), warnings
    # The same replacements whatever the number of workers: the choice follows the stream position.
    if workers:
        single, _ = _first_batch(_cfg(root, 0, policy="skip"))
        assert single["img_paths"] == batch["img_paths"]


def test_skip_summary_per_epoch(root, loader_logs):
    clean, loader = _first_batch(_cfg(root))
    _break(root / os.path.relpath(clean["img_paths"][0], root), "corrupt")
    loader = build_reid_train_loader(_cfg(root, policy="skip"))
    per_epoch = loader.bad_images.batches_per_epoch
    list(itertools.islice(iter(loader), per_epoch))
    loader.close()
    summaries = [r.getMessage() for r in loader_logs.records if "replaced so far" in r.getMessage()]
    assert summaries and summaries[-1].startswith(f"{loader.bad_images.count} unreadable training image(s)")
    assert clean["img_paths"][0] in summaries[-1]


def test_identity_without_any_readable_image(root):
    clean, _ = _first_batch(_cfg(root))
    folder = root / os.path.relpath(os.path.dirname(clean["img_paths"][0]), root)
    for path in list(folder.iterdir()):
        _break(path, "corrupt")
    with pytest.raises(ImageReadError, match=r"no readable image of identity \d+ is left \(4 unreadable"):
        _first_batch(_cfg(root, policy="skip"))


def test_on_bad_image_value_is_checked():
    cfg = _cfg("/nowhere")
    cfg.DATALOADER.ON_BAD_IMAGE = "ignore"
    with pytest.raises(ReidUserError, match="DATALOADER.ON_BAD_IMAGE.*error, skip") as err:
        check_data_config(cfg)
    assert "\n" not in str(err.value)


def _train_args(root, out, *extra):
    from tests.e2e.test_train_net import tiny_args

    return tiny_args(str(root), out, "DATASETS.NAMES", "('ImageFolder:tiny',)", "DATASETS.TESTS", "()",
                     "MODEL.BACKBONE.WIDTH_MULT", "0.25", "SOLVER.IMS_PER_BATCH", "8", "SOLVER.MAX_EPOCH", "1",
                     *extra)


def test_command_error_through_two_loader_workers_is_one_line(root, tmp_path, capsys):
    """`reid-train` (in-process, its own error boundary) with 2 loader workers: one line, exit 1."""
    from reid_engine.cli.train import main

    victim = sorted((root / "tiny" / "train" / "002").iterdir())[1]
    _break(victim, "corrupt")
    assert main(_train_args(root, tmp_path / "out", "DATALOADER.NUM_WORKERS", "2")) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"reid-train: error: cannot read image '{victim}'"), err
    assert "(ImageFolder:tiny)" in err[0] and "training item" in err[0] and "worker process" in err[0]
    assert not list((tmp_path / "out").glob("*.pth"))


def test_command_with_skip_trains_on_and_logs(root, tmp_path, capsys):
    from reid_engine.cli.train import main

    victim = sorted((root / "tiny" / "train" / "003").iterdir())[0]
    _break(victim, "corrupt")  # every identity has K = 4 images: the victim is in the epoch
    items_before = len(list((root / "tiny" / "train").rglob("*.jpg")))
    out = tmp_path / "out"
    assert main(_train_args(root, out, "DATALOADER.ON_BAD_IMAGE", "skip")) == 0, capsys.readouterr().err
    log = (out / "log.txt").read_text()
    assert f"DATALOADER.ON_BAD_IMAGE skip: cannot read image '{victim}'" in log
    assert "1 unreadable training image(s) replaced so far" in log
    assert (out / "model_final.pth").exists()
    assert len(list((root / "tiny" / "train").rglob("*.jpg"))) == items_before  # nothing removed


def test_skip_replaces_a_tracklet_with_an_unreadable_frame(clean_root, tmp_path):
    from reid_engine.data.tracklets import TrainTrackletSet
    from reid_engine.data.transforms import build_transforms

    frames = sorted(str(p) for p in (clean_root / "tiny" / "train").rglob("*.jpg"))
    by_pid = {}
    for path in frames:
        by_pid.setdefault(int(os.path.basename(os.path.dirname(path))), []).append(path)
    # Two 2-frame tracklets per identity; the first frame of tracklet 0 is replaced by a broken file.
    items = [(tuple(paths[i:i + 2]), pid - 1, 0) for pid, paths in sorted(by_pid.items()) for i in (0, 2)]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    items[0] = ((str(broken), items[0][0][1]), items[0][1], 0)
    cfg = _cfg(tmp_path)
    options = {"seq_len": 2, "method": "evenly", "domain_names": ["VideoSet"]}
    dataset = TrainTrackletSet(items, build_transforms(cfg, is_train=True), IDS, 1, on_bad_image="skip", **options)
    sample = dataset[(0, (7, 0, 0))]
    assert sample["target"] == items[0][1] and sample["image"].shape[0] == 2
    assert sample["bad_images"] == [(str(broken), "training item 0 (VideoSet)", sample["bad_images"][0][2])]
    strict = TrainTrackletSet(items, build_transforms(cfg, is_train=True), IDS, 1, **options)
    with pytest.raises(ImageReadError, match=r"broken\.jpg.*training item 0 \(VideoSet\)"):
        strict[(0, (7, 0, 0))]
