"""torchreid's sensereid: a test-only set renumbered by the gallery's ids."""

import os

import pytest

from reid_engine.config import ConfigError, get_cfg
from reid_engine.data.build import check_data_config
from reid_engine.data.datasets import DatasetFormatError, collect_file_problems, get_dataset
from tests.data.datasets.fake_trees import relative, touch, touch_all

BASE = "sensereid/SenseReID"


def make(root):
    touch_all(os.path.join(root, BASE, "test_probe"), ["0007_0.jpg", "0042_0.jpg"])
    touch_all(os.path.join(root, BASE, "test_gallery"), ["0007_1.jpg", "0042_1.jpg", "0042_2.jpg", "0100_1.jpg"])


def test_ids_renumbered_by_the_gallery(tmp_path):
    root = str(tmp_path)
    make(root)
    ds = get_dataset("sensereid", root, key="DATASETS.TESTS")
    assert ds.train == []
    # gallery ids 7, 42, 100 -> 0, 1, 2 in both splits; cameras as written
    assert relative(ds.query, root) == [(f"{BASE}/test_probe/0007_0.jpg", 0, 0), (f"{BASE}/test_probe/0042_0.jpg", 1, 0)]
    assert relative(ds.gallery, root) == [(f"{BASE}/test_gallery/0007_1.jpg", 0, 1),
                                          (f"{BASE}/test_gallery/0042_1.jpg", 1, 1),
                                          (f"{BASE}/test_gallery/0042_2.jpg", 1, 2),
                                          (f"{BASE}/test_gallery/0100_1.jpg", 2, 1)]


def test_probe_ids_need_gallery_images_and_names_follow_the_pattern(tmp_path):
    root = str(tmp_path)
    make(root)
    lonely = touch(os.path.join(root, BASE, "test_probe", "0055_0.jpg"))
    with pytest.raises(DatasetFormatError, match="0055_0.jpg.*also has test_gallery/ images"):
        get_dataset("sensereid", root, key="DATASETS.TESTS")
    touch(os.path.join(root, BASE, "test_gallery", "x.jpg"))
    with collect_file_problems() as problems:
        ds = get_dataset("sensereid", root, key="DATASETS.TESTS")
    assert len(ds.query) == 2 and sorted(p.path for p in problems) == sorted(
        [lonely, os.path.join(root, BASE, "test_gallery", "x.jpg")])


def test_test_only_set_is_refused_for_training():
    cfg = get_cfg()
    cfg.DATASETS.NAMES = ("Market1501", "sensereid")
    cfg.DATASETS.TESTS = ("sensereid",)
    with pytest.raises(ConfigError) as err:
        check_data_config(cfg)
    message = str(err.value)
    assert "\n" not in message and "DATASETS.NAMES: sensereid has test images only" in message
    assert "Market1501" in message and "cuhkSYSU" in message and " sensereid," not in message
