"""CUHK01 (random splits, DATASETS.SPLIT_ID) and CUHK02 (fixed protocol) on fake trees."""

import json
import os

import pytest

from reid_engine.config import ConfigError
from reid_engine.data.datasets import (
    DatasetFormatError,
    DatasetNotFoundError,
    SplitFileError,
    collect_file_problems,
    get_dataset,
)
from reid_engine.data.datasets.splits import SPLIT_FILE_NAME
from tests.data.datasets.fake_trees import relative, touch, touch_all, write

NUM_PEOPLE = 12


def make_cuhk01(root, num_people=NUM_PEOPLE):
    """campus/<pid 4 digits><image 001-004>.png: images 1-2 are view 0, 3-4 view 1."""
    touch_all(os.path.join(root, "cuhk01", "campus"),
              [f"{p:04d}{i:03d}.png" for p in range(1, num_people + 1) for i in range(1, 5)])
    return os.path.join(root, "cuhk01")


def test_cuhk01_ids_views_and_split(tmp_path):
    root = str(tmp_path)
    base = make_cuhk01(root)
    ds = get_dataset("cuhk01", root)
    # Half the people (rounded down) train with all 4 images; test pids keep their 0-based value.
    assert ds.num_train_pids == NUM_PEOPLE // 2 and len(ds.train) == 4 * (NUM_PEOPLE // 2)
    test_pids = sorted({pid for _, pid, _ in ds.query})
    assert len(test_pids) == NUM_PEOPLE - NUM_PEOPLE // 2
    assert sorted({pid for _, pid, _ in ds.gallery}) == test_pids and max(test_pids) <= NUM_PEOPLE - 1
    # SPLIT_ID 0: view 0 (images 1-2) is the query, view 1 (3-4) the gallery
    for _, pid, cam in ds.query:
        assert cam == 0
    assert all(cam == 1 for _, _, cam in ds.gallery) and len(ds.query) == len(ds.gallery) == 2 * len(test_pids)
    name_of = {os.path.basename(p): (pid, cam) for p, pid, cam in ds.query + ds.gallery}
    pid = test_pids[0]
    assert [name_of[f"{pid + 1:04d}{i:03d}.png"] for i in range(1, 5)] == [(pid, 0), (pid, 0), (pid, 1), (pid, 1)]
    assert os.path.isfile(os.path.join(base, SPLIT_FILE_NAME))


def test_cuhk01_split_id_reproducible_swapped_and_distinct(tmp_path):
    root = str(tmp_path)
    base = make_cuhk01(root)
    first = get_dataset("cuhk01", root, split_id=0)
    split_file = os.path.join(base, SPLIT_FILE_NAME)
    with open(split_file) as f:
        stored = json.load(f)
    assert len(stored["splits"]) == 10  # 10 draws, 20 SPLIT_IDs (each draw both ways)
    again = get_dataset("cuhk01", root, split_id=0)
    assert (relative(again.train, root), relative(again.query, root)) == (relative(first.train, root),
                                                                        relative(first.query, root))
    swapped = get_dataset("cuhk01", root, split_id=1)  # the same draw, view 1 as the query
    assert relative(swapped.query, root) == relative(first.gallery, root)
    assert relative(swapped.train, root) == relative(first.train, root)
    other = get_dataset("cuhk01", root, split_id=2)
    assert relative(other.train, root) != relative(first.train, root)
    with pytest.raises(ConfigError, match=r"DATASETS.SPLIT_ID 20 is out of range for cuhk01: it has 20 splits"):
        get_dataset("cuhk01", root, split_id=20)


def test_cuhk01_reuses_the_split_file(tmp_path):
    root = str(tmp_path)
    base = make_cuhk01(root)
    get_dataset("cuhk01", root)
    write(os.path.join(base, SPLIT_FILE_NAME), json.dumps({"splits": [{"train": [0, 1], "test": [2, 3, 4]}]}))
    ds = get_dataset("cuhk01", root)  # the file wins over a new draw
    assert sorted({os.path.basename(p)[:4] for p, _, _ in ds.train}) == ["0001", "0002"]
    assert sorted({pid for _, pid, _ in ds.query}) == [2, 3, 4]


@pytest.mark.parametrize("content,reason", [("{not json", "JSONDecodeError"),
                                            ('{"splits": [{"train": [0]}]}', "expected"),
                                            ('{"splits": [{"train": [0], "test": [99]}]}', "99")])
def test_cuhk01_unusable_split_file_is_one_line_naming_it_and_kept(tmp_path, content, reason):
    root = str(tmp_path)
    split_file = write(os.path.join(make_cuhk01(root), SPLIT_FILE_NAME), content)
    with pytest.raises(SplitFileError) as err:
        get_dataset("cuhk01", root)
    message = str(err.value)
    assert "\n" not in message and split_file in message and reason in message and "delete it" in message
    with open(split_file) as f:
        assert f.read() == content  # nothing deleted or rewritten


def test_cuhk01_names_missing_folder_and_zip(tmp_path):
    root = str(tmp_path)
    with pytest.raises(DatasetNotFoundError, match=r"'cuhk01/' containing campus/"):
        get_dataset("cuhk01", root)
    touch(os.path.join(root, "cuhk01", "CUHK01.zip"))
    with pytest.raises(DatasetNotFoundError, match="extract it"):
        get_dataset("cuhk01", root)


def test_cuhk01_bad_name(tmp_path):
    root = str(tmp_path)
    base = make_cuhk01(root)
    touch(os.path.join(base, "campus", "0001000.png"))  # image numbers start at 001
    with pytest.raises(DatasetFormatError, match=r"0001000.png.*<pid 4 digits><image 001-999>.png"):
        get_dataset("cuhk01", root)


def make_cuhk02(root):
    """P1..P5, two cameras each; the number 001 exists in P1 and P2 (two different people)."""
    base = os.path.join(root, "cuhk02", "Dataset")
    files = {"P1": (["001_1.png", "002_1.png"], ["001_2.png", "002_2.png"]),
             "P2": (["001_1.png"], ["001_2.png"]),
             "P3": (["007_1.png"], ["007_2.png"]),
             "P4": (["003_1.png"], ["003_2.png"]),
             "P5": (["010_1.png", "011_1.png"], ["010_2.png", "011_2.png", "012_2.png"])}
    for pair, cams in files.items():
        for cam, names in zip(("cam1", "cam2"), cams):
            touch_all(os.path.join(base, pair, cam), names)
    return base


def test_cuhk02_fixed_protocol(tmp_path):
    root = str(tmp_path)
    make_cuhk02(root)
    ds = get_dataset("cuhk02", root)
    d = "cuhk02/Dataset"
    # ids numbered pair by pair (P1: 0, 1; P2: 2; P3: 3; P4: 4); camid counts camera folders.
    assert relative(ds.train, root) == [
        (f"{d}/P1/cam1/001_1.png", 0, 0), (f"{d}/P1/cam1/002_1.png", 1, 0),
        (f"{d}/P1/cam2/001_2.png", 0, 1), (f"{d}/P1/cam2/002_2.png", 1, 1),
        (f"{d}/P2/cam1/001_1.png", 2, 2), (f"{d}/P2/cam2/001_2.png", 2, 3),
        (f"{d}/P3/cam1/007_1.png", 3, 4), (f"{d}/P3/cam2/007_2.png", 3, 5),
        (f"{d}/P4/cam1/003_1.png", 4, 6), (f"{d}/P4/cam2/003_2.png", 4, 7)]
    assert relative(ds.query, root) == [(f"{d}/P5/cam1/010_1.png", 10, 8), (f"{d}/P5/cam1/011_1.png", 11, 8)]
    assert relative(ds.gallery, root) == [(f"{d}/P5/cam2/010_2.png", 10, 9), (f"{d}/P5/cam2/011_2.png", 11, 9),
                                          (f"{d}/P5/cam2/012_2.png", 12, 9)]


def test_cuhk02_errors(tmp_path):
    root = str(tmp_path)
    with pytest.raises(DatasetNotFoundError, match=r"'cuhk02/Dataset/' containing P1/ ... P5/"):
        get_dataset("cuhk02", root)
    base = make_cuhk02(root)
    touch(os.path.join(base, "P3", "cam2", "photo.png"))
    with pytest.raises(DatasetFormatError, match=r"photo.png.*<pid>_<k>.png"):
        get_dataset("cuhk02", root)
    with collect_file_problems() as problems:
        get_dataset("cuhk02", root)
    assert [os.path.basename(p.path) for p in problems] == ["photo.png"]
