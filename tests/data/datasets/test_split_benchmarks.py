"""torchreid's viper, ilids, prid and grid: ids, cameras, distractors and DATASETS.SPLIT_ID splits on fake trees."""

import json
import os

import numpy as np
import pytest
from scipy.io import savemat

from reid_engine.config import ConfigError
from reid_engine.data.datasets import DatasetFormatError, DatasetNotFoundError, SplitFileError, get_dataset
from reid_engine.data.datasets.splits import SPLIT_FILE_NAME
from tests.data.datasets.fake_trees import make_viper_images, relative, touch, touch_all, write


def split_signature(ds, root):
    return relative(ds.train, root), relative(ds.query, root), relative(ds.gallery, root)


# ---------------------------------------------------------------------------------- viper

def test_viper_pairs_folders_by_position(tmp_path):
    root = str(tmp_path)
    make_viper_images(os.path.join(root, "viper", "VIPeR"), 10)
    ds = get_dataset("viper", root)
    assert (len(ds.train), ds.num_train_pids, ds.num_train_cams) == (10, 5, 2)
    assert len(ds.query) == len(ds.gallery) == 5
    # SPLIT_ID 0: cam_a is the query (camid 0), cam_b the gallery (camid 1); test pids 0..4
    assert {cam for _, _, cam in ds.query} == {0} and {cam for _, _, cam in ds.gallery} == {1}
    assert sorted(pid for _, pid, _ in ds.query) == list(range(5))
    for (qa, qpid, _), (gb, gpid, _) in zip(sorted(ds.query, key=lambda i: i[1]), sorted(ds.gallery, key=lambda i: i[1])):
        assert qpid == gpid and os.path.basename(qa)[:3] == os.path.basename(gb)[:3]  # the same person
    train_people = {os.path.basename(p)[:3] for p, _, _ in ds.train}
    assert not train_people & {os.path.basename(p)[:3] for p, _, _ in ds.query}
    assert os.path.isfile(os.path.join(root, "viper", SPLIT_FILE_NAME))


def test_viper_split_ids(tmp_path):
    root = str(tmp_path)
    make_viper_images(os.path.join(root, "viper", "VIPeR"), 10)
    first = get_dataset("viper", root, split_id=0)
    assert split_signature(get_dataset("viper", root, split_id=0), root) == split_signature(first, root)
    swapped = get_dataset("viper", root, split_id=1)
    assert {cam for _, _, cam in swapped.query} == {1}
    assert relative(swapped.query, root) == relative(first.gallery, root)
    assert relative(get_dataset("viper", root, split_id=4).train, root) != relative(first.train, root)
    with pytest.raises(ConfigError, match="DATASETS.SPLIT_ID -1 is out of range for viper"):
        get_dataset("viper", root, split_id=-1)


def test_viper_folders_must_pair(tmp_path):
    root = str(tmp_path)
    base = os.path.join(root, "viper", "VIPeR")
    make_viper_images(base, 3)
    touch(os.path.join(base, "cam_b", "099_0.bmp"))
    with pytest.raises(DatasetFormatError, match="cam_a/ holds 3 images and cam_b/ 4"):
        get_dataset("viper", root)
    with pytest.raises(DatasetNotFoundError, match=r"'viper/VIPeR/' containing cam_a/ and cam_b/"):
        get_dataset("viper", str(tmp_path / "elsewhere"))


# ---------------------------------------------------------------------------------- ilids

def make_ilids(root, images_per_person=(4, 3, 2, 4, 2)):
    base = os.path.join(root, "ilids", "i-LIDS_Pedestrian", "Persons")
    touch_all(base, [f"{pid:04d}{i:03d}.jpg" for pid, n in enumerate(images_per_person, 1) for i in range(1, n + 1)])
    return os.path.join(root, "ilids")


def test_ilids_protocol(tmp_path):
    root = str(tmp_path)
    make_ilids(root)
    ds = get_dataset("ilids", root)
    # 5 people: 2 train with all their images, 3 test with one query and one gallery image each.
    assert ds.num_train_pids == 2
    assert len(ds.query) == len(ds.gallery) == 3
    assert sorted(p for _, p, _ in ds.query) == sorted(p for _, p, _ in ds.gallery)
    for path, pid, cam in ds.query + ds.gallery:
        name = os.path.basename(path)
        assert (pid, cam) == (int(name[:4]), int(name[4:7]) - 1)  # raw pid; image number - 1 as camera
    assert not {p for p, _, _ in ds.query} & {p for p, _, _ in ds.gallery}
    assert len(ds.train) == sum((4, 3, 2, 4, 2)) - sum(
        (4, 3, 2, 4, 2)[pid - 1] for _, pid, _ in ds.query)


def test_ilids_split_ids_and_file_reuse(tmp_path):
    root = str(tmp_path)
    base = make_ilids(root)
    first = get_dataset("ilids", root)
    assert split_signature(get_dataset("ilids", root), root) == split_signature(first, root)
    others = [split_signature(get_dataset("ilids", root, split_id=k), root) for k in range(1, 10)]
    assert any(other != split_signature(first, root) for other in others)
    with pytest.raises(ConfigError, match=r"use 0..9"):
        get_dataset("ilids", root, split_id=10)
    write(os.path.join(base, SPLIT_FILE_NAME), json.dumps(
        {"splits": [{"train": ["0001001.jpg"], "query": ["0002001.jpg"], "gallery": ["0002002.jpg"]}]}))
    ds = get_dataset("ilids", root)
    assert [os.path.basename(p) for p, _, _ in ds.train] == ["0001001.jpg"]
    write(os.path.join(base, SPLIT_FILE_NAME), json.dumps(
        {"splits": [{"train": ["0001001.jpg"], "query": ["0009001.jpg"], "gallery": ["0002002.jpg"]}]}))
    with pytest.raises(SplitFileError, match="its query list names '0009001.jpg'"):
        get_dataset("ilids", root)


def test_ilids_needs_two_images_per_person(tmp_path):
    make_ilids(str(tmp_path), (3, 1))
    with pytest.raises(DatasetFormatError, match="person 0002 has only one image"):
        get_dataset("ilids", str(tmp_path))


# ----------------------------------------------------------------------------------- prid

def make_prid(root, cam_a_people=205, cam_b_people=210):
    base = os.path.join(root, "prid2011", "prid_2011", "single_shot")
    touch_all(os.path.join(base, "cam_a"), [f"person_{p:04d}.png" for p in range(1, cam_a_people + 1)])
    touch_all(os.path.join(base, "cam_b"), [f"person_{p:04d}.png" for p in range(1, cam_b_people + 1)])
    return base


def test_prid_protocol_and_distractors(tmp_path):
    root = str(tmp_path)
    make_prid(root)
    ds = get_dataset("prid", root)
    # people 1-200 are paired: 100 train (both images), 100 test; cam_b 201-210 are distractors,
    # cam_a-only people 201-205 are not used.
    assert (ds.num_train_pids, len(ds.train)) == (100, 200)
    test_pids = sorted(pid for _, pid, _ in ds.query)
    assert len(test_pids) == 100 and max(test_pids) <= 200
    assert {cam for _, _, cam in ds.query} == {0} and {cam for _, _, cam in ds.gallery} == {1}
    assert sorted(pid for _, pid, _ in ds.gallery) == test_pids + list(range(201, 211))
    assert ds.distractor_pids == frozenset(range(201, 211))
    combined = get_dataset("prid", root, combineall=True)
    assert combined.num_train_pids == 200  # the distractors are not folded into training


def test_prid_split_ids(tmp_path):
    root = str(tmp_path)
    make_prid(root)
    first = get_dataset("prid", root)
    assert split_signature(get_dataset("prid", root, split_id=0), root) == split_signature(first, root)
    assert relative(get_dataset("prid", root, split_id=3).train, root) != relative(first.train, root)
    assert os.path.isfile(os.path.join(root, "prid2011", SPLIT_FILE_NAME))


def test_prid_needs_people_1_to_200_in_both_cameras(tmp_path):
    root = str(tmp_path)
    base = make_prid(root)
    os.remove(os.path.join(base, "cam_b", "person_0150.png"))
    with pytest.raises(DatasetNotFoundError, match=r"cam_b/person_0150.png"):
        get_dataset("prid", root)


def test_unreadable_split_file_names_the_file(tmp_path):
    root = str(tmp_path)
    make_prid(root)
    split_file = write(os.path.join(root, "prid2011", SPLIT_FILE_NAME), "\x00garbage")
    with pytest.raises(SplitFileError) as err:
        get_dataset("prid", root)
    assert "\n" not in str(err.value) and split_file in str(err.value)
    assert os.path.exists(split_file)


# ----------------------------------------------------------------------------------- grid

GRID_PARTITIONS = [[1, 2], [3, 4], [2, 5]] + [[k % 6 + 1, (k + 1) % 6 + 1] for k in range(7)]


def make_grid(root, compress=False):
    base = os.path.join(root, "grid", "underground_reid")
    touch_all(os.path.join(base, "probe"), [f"{pid:04d}_{pid % 8 + 1}_1_1_1_1_1.jpeg" for pid in range(1, 7)])
    touch_all(os.path.join(base, "gallery"), [f"{pid:04d}_{(pid + 3) % 8 + 1}_2_2_2_2_2.jpeg" for pid in range(1, 7)]
              + ["0000_1_3_3_3_3_3.jpeg", "0000_7_4_4_4_4_4.jpeg"])
    # trainIdxAll: a cell of structs whose 3rd field lists the partition's training ids
    cells = np.empty((1, len(GRID_PARTITIONS)), dtype=object)
    for k, ids in enumerate(GRID_PARTITIONS):
        cells[0, k] = {"trainIdx0": float(k), "testIdx": np.zeros((1, 2)), "trainIdx": np.array([ids], dtype=float)}
    savemat(os.path.join(base, "features_and_partitions.mat"), {"trainIdxAll": cells, "features": np.ones((1, 2))},
            do_compression=compress)
    return base


@pytest.mark.parametrize("compress", [False, True])
def test_grid_partitions_from_the_mat_file(tmp_path, compress):
    root = str(tmp_path)
    make_grid(root, compress)
    ds = get_dataset("grid", root)  # partition 0: people 1 and 2 train
    assert sorted(os.path.basename(p)[:4] for p, _, _ in ds.train) == ["0001", "0001", "0002", "0002"]
    assert ds.num_train_pids == 2
    assert sorted((pid, cam) for _, pid, cam in ds.query) == [(pid, pid % 8) for pid in range(3, 7)]
    # the other paired people plus the pid-0 distractors (kept; camera - 1 as camid)
    assert sorted((pid, cam) for _, pid, cam in ds.gallery) == [(0, 0), (0, 6)] + [
        (pid, (pid + 3) % 8) for pid in range(3, 7)]
    other = get_dataset("grid", root, split_id=2)
    assert sorted({os.path.basename(p)[:4] for p, _, _ in other.train}) == ["0002", "0005"]
    assert get_dataset("grid", root, combineall=True).num_train_pids == 6  # pid 0 never trains
    with pytest.raises(ConfigError, match=r"DATASETS.SPLIT_ID 10 is out of range for grid: it has 10 splits "
                                          r"\(from '.*features_and_partitions.mat'\)"):
        get_dataset("grid", root, split_id=10)


def test_grid_unreadable_partitions_name_the_file(tmp_path):
    root = str(tmp_path)
    base = make_grid(root)
    mat = write(os.path.join(base, "features_and_partitions.mat"), "not a mat file")
    with pytest.raises(DatasetFormatError) as err:
        get_dataset("grid", root)
    assert "\n" not in str(err.value) and mat in str(err.value) and "cannot read the MATLAB file" in str(err.value)
    savemat(mat, {"other": np.ones((1, 1))})
    with pytest.raises(DatasetFormatError, match="holds no trainIdxAll partitions"):
        get_dataset("grid", root)
    os.remove(mat)
    with pytest.raises(DatasetNotFoundError, match="missing file .*features_and_partitions.mat"):
        get_dataset("grid", root)
