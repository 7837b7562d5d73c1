"""University-1652 (drone query, satellite gallery) on a fake tree."""

import os

import pytest

from reid_engine.data.datasets import DatasetFormatError, DatasetNotFoundError, collect_file_problems, get_dataset
from tests.data.datasets.fake_trees import relative, touch, touch_all

BASE = "university1652/University-Release"
FILES = ["train/drone/0839/image-01.jpeg", "train/drone/0839/image-02.jpeg", "train/satellite/0839/0839.jpg",
         "train/street/0842/a.JPG", "train/google/0842/b.png",
         "test/query_drone/0001/image-01.jpeg", "test/query_drone/0002/image-01.jpeg",
         "test/gallery_satellite/0001/0001.jpg", "test/gallery_satellite/0002/0002.jpg",
         "test/gallery_satellite/0003/0003.jpg",
         "test/query_satellite/0001/0001.jpg", "test/gallery_drone/0001/image-01.jpeg"]  # other tasks: unused


def make(root):
    touch_all(os.path.join(root, BASE), FILES)


def test_ids_and_one_camera_per_image(tmp_path):
    root = str(tmp_path)
    make(root)
    ds = get_dataset("university1652", root)
    rel = lambda items: [(p[len(BASE) + 1:], pid) for p, pid, _ in relative(items, root)]  # noqa: E731
    # A building keeps one id over every view (train relabelled: 0839 -> 0, 0842 -> 1).
    assert rel(ds.train) == [("train/drone/0839/image-01.jpeg", 0), ("train/drone/0839/image-02.jpeg", 0),
                             ("train/google/0842/b.png", 1), ("train/satellite/0839/0839.jpg", 0),
                             ("train/street/0842/a.JPG", 1)]
    assert rel(ds.query) == [("test/query_drone/0001/image-01.jpeg", 1), ("test/query_drone/0002/image-01.jpeg", 2)]
    assert rel(ds.gallery) == [("test/gallery_satellite/0001/0001.jpg", 1), ("test/gallery_satellite/0002/0002.jpg", 2),
                               ("test/gallery_satellite/0003/0003.jpg", 3)]
    # Every image has its own camid, from one counter over train, query and gallery.
    camids = [cam for _, _, cam in ds.train + ds.query + ds.gallery]
    assert sorted(camids) == list(range(10))


def test_errors(tmp_path):
    root = str(tmp_path)
    with pytest.raises(DatasetNotFoundError, match=r"'university1652/University-Release/' containing train/<view>"):
        get_dataset("university1652", root)
    make(root)
    touch(os.path.join(root, BASE, "test", "query_drone", "misc", "x.jpeg"))
    with pytest.raises(DatasetFormatError, match=r"query_drone/misc'.*building number"):
        get_dataset("university1652", root)
    with collect_file_problems() as problems:
        ds = get_dataset("university1652", root)
    assert len(ds.query) == 2 and [os.path.basename(p.path) for p in problems] == ["misc"]
