"""The tracklet parsers (mars, ilidsvid, prid2011, dukemtmcvidreid) on tiny fake trees built from the layout facts."""

import json
import os

import numpy as np
import pytest
from scipy.io import savemat

from reid_engine.config import ConfigError
from reid_engine.data.datasets import DATASET_REGISTRY, DatasetFormatError, DatasetNotFoundError, get_dataset

from .fake_trees import touch, write


def _base(items, root):
    """``(frame names relative to root, pid, camid)`` of tracklet items, sorted."""
    return sorted((tuple(os.path.relpath(p, root) for p in paths), pid, cam) for paths, pid, cam in items)


# ----------------------------------------------------------------------------------------- MARS
def _mars_tree(root):
    """3 train tracklets (one junk), 5 test tracklets: 2 queries, one junk and one distractor in the gallery."""
    base = os.path.join(root, "mars")
    train = [("0001", 1, 1, 3), ("0001", 2, 2, 2), ("00-1", 4, 1, 2), ("0003", 5, 3, 2)]
    test = [("0007", 1, 1, 2), ("0007", 2, 2, 3), ("0008", 3, 2, 2), ("0008", 4, 6, 2), ("00-1", 5, 1, 1),
            ("0000", 6, 3, 2)]

    def build(split, tracks):
        names, rows = [], []
        for pid_text, tracklet, cam, n in tracks:
            start = len(names) + 1
            for f in range(1, n + 1):
                name = f"{pid_text}C{cam}T{tracklet:04d}F{f:03d}.jpg"
                names.append(name)
                touch(os.path.join(base, f"bbox_{split}", name[:4], name))
            pid = -1 if pid_text == "00-1" else int(pid_text)
            rows.append([start, len(names), pid, cam])
        write(os.path.join(base, "info", f"{split}_name.txt"), "\n".join(names) + "\n")
        savemat(os.path.join(base, "info", f"tracks_{split}_info.mat"), {f"track_{split}_info": np.array(rows, dtype=float)})

    build("train", train)
    build("test", test)
    savemat(os.path.join(base, "info", "query_IDX.mat"), {"query_IDX": np.array([[1.0, 3.0]])})
    return base


def test_mars(tmp_path):
    base = _mars_tree(str(tmp_path))
    ds = get_dataset("mars", str(tmp_path))
    assert [len(paths) for paths, _, _ in ds.train] == [3, 2, 2]
    assert [(pid, cam) for _, pid, cam in ds.train] == [(0, 0), (0, 1), (1, 2)]  # relabelled; junk row skipped
    assert ds.train[0][0][0] == os.path.join(base, "bbox_train", "0001", "0001C1T0001F001.jpg")
    assert [(pid, cam) for _, pid, cam in ds.query] == [(7, 0), (8, 1)]  # query_IDX rows 1 and 3, raw ids
    assert [(pid, cam, len(p)) for p, pid, cam in ds.gallery] == [(7, 1, 3), (8, 5, 2), (0, 2, 2)]
    assert ds.junk_counts == {"train": 1, "query": 0, "gallery": 1}
    assert 0 in ds.distractor_pids  # pid 0 stays in the gallery as a negative


def test_mars_errors(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="mars.*'mars/'.*bbox_train"):
        get_dataset("mars", str(tmp_path))
    base = _mars_tree(str(tmp_path))
    os.remove(os.path.join(base, "info", "query_IDX.mat"))
    with pytest.raises(DatasetNotFoundError, match="query_IDX.mat"):
        get_dataset("mars", str(tmp_path))


# ------------------------------------------------------------------------------------ iLIDS-VID
def _ilidsvid_tree(root, people=6, splits=((1, 2, 3, 4, 5, 6), (6, 5, 4, 3, 2, 1))):
    base = os.path.join(root, "ilids-vid")
    for cam in ("cam1", "cam2"):
        for k in range(1, people + 1):
            for frame in (317, 45, 1000):  # listed out of temporal order on purpose
                touch(os.path.join(base, "i-LIDS-VID", "sequences", cam, f"person{k:03d}",
                                   f"{cam}_person{k:03d}_{frame:05d}.png"))
    os.makedirs(os.path.join(base, "train-test people splits"))
    savemat(os.path.join(base, "train-test people splits", "train_test_splits_ilidsvid.mat"),
            {"ls_set": np.array(splits, dtype=float)})
    return base


def test_ilidsvid(tmp_path):
    base = _ilidsvid_tree(str(tmp_path))
    ds = get_dataset("ilidsvid", str(tmp_path), split_id=0)
    seq = os.path.join(base, "i-LIDS-VID", "sequences")
    # split 0: first half (people 1-3) test, last half (4-6) train; pid = position in the split
    assert [(os.path.basename(p[0]).split("_")[1], pid, cam) for p, pid, cam in ds.query] == [
        ("person001", 0, 0), ("person002", 1, 0), ("person003", 2, 0)]
    assert all(cam == 1 for _, _, cam in ds.gallery) and len(ds.gallery) == 3
    assert sorted((pid, cam) for _, pid, cam in ds.train) == [(p, c) for p in range(3) for c in (0, 1)]
    assert ds.query[0][0] == tuple(os.path.join(seq, "cam1", "person001", f"cam1_person001_{f:05d}.png")
                                   for f in (45, 317, 1000))  # ordered by frame number
    other = get_dataset("ilidsvid", str(tmp_path), split_id=1)
    assert {os.path.basename(p[0]).split("_")[1] for p, _, _ in other.query} == {"person004", "person005",
                                                                                  "person006"}
    with pytest.raises(ConfigError, match="DATASETS.SPLIT_ID 2 .*0..1"):
        get_dataset("ilidsvid", str(tmp_path), split_id=2)


# ------------------------------------------------------------------------------------- PRID2011
def _prid2011_tree(root, people=(1, 2, 3, 4, 5), only_a=(9,)):
    base = os.path.join(root, "prid2011")
    for cam, persons in (("cam_a", people + only_a), ("cam_b", people)):
        for k in persons:
            for frame in (2, 1, 10):
                touch(os.path.join(base, "prid_2011", "multi_shot", cam, f"person_{k:04d}", f"{frame:04d}.png"))
    return base


def test_prid2011_drawn_splits_are_reproducible(tmp_path):
    base = _prid2011_tree(str(tmp_path))
    ds = get_dataset("prid2011", str(tmp_path), split_id=3)
    split_file = os.path.join(base, "splits_reid_engine_video.json")
    saved = json.load(open(split_file))["splits"]
    assert len(saved) == 10 and all(len(s["train"]) == 2 and len(s["test"]) == 3 for s in saved)
    assert "person_0009" not in {n for s in saved for n in s["train"] + s["test"]}  # only one camera
    assert [(pid, cam) for _, pid, cam in ds.query] == [(0, 0), (1, 0), (2, 0)]
    assert [(pid, cam) for _, pid, cam in ds.gallery] == [(0, 1), (1, 1), (2, 1)]
    assert [os.path.basename(p) for p in ds.query[0][0]] == ["0001.png", "0002.png", "0010.png"]
    os.remove(split_file)  # drawn again identically
    again = get_dataset("prid2011", str(tmp_path), split_id=3)
    assert json.load(open(split_file))["splits"] == saved and again.query == ds.query


def test_prid2011_reads_torchreid_split_file(tmp_path):
    base = _prid2011_tree(str(tmp_path))
    write(os.path.join(base, "splits_prid2011.json"),
          json.dumps([{"train": ["person_0001", "person_0002"], "test": ["person_0005", "person_0003"]}]))
    ds = get_dataset("prid2011", str(tmp_path))
    assert [(p[0].split(os.sep)[-2], pid) for p, pid, _ in ds.query] == [("person_0005", 0), ("person_0003", 1)]
    assert not os.path.exists(os.path.join(base, "splits_reid_engine_video.json"))
    with pytest.raises(ConfigError, match="SPLIT_ID 1"):
        get_dataset("prid2011", str(tmp_path), split_id=1)


# --------------------------------------------------------------------------- DukeMTMC-VideoReID
def _dukevid_tree(root):
    base = os.path.join(root, "dukemtmc-vidreid", "DukeMTMC-VideoReID")
    tracks = {"train": [("0002", "0001", "0002_C1_F{:04d}_X00001.jpg", (2, 3, 4)),
                        ("0002", "0007", "0002C5F{:04d}X00007.jpg", (10, 9)),  # old name form
                        ("0009", "0003", "0009_C2_F{:04d}_X00003.jpg", (1,))],
              "query": [("0011", "0004", "0011_C1_F{:04d}_X00004.jpg", (1, 2))],
              "gallery": [("0011", "0005", "0011_C3_F{:04d}_X00005.jpg", (5, 6, 7)),
                          ("0012", "0006", "0012_C1_F{:04d}_X00006.jpg", (1,))]}
    for split, entries in tracks.items():
        for pid, tracklet, pattern, frames in entries:
            for f in frames:
                touch(os.path.join(base, split, pid, tracklet, pattern.format(f)))
    return base


def test_dukemtmcvidreid(tmp_path):
    base = _dukevid_tree(str(tmp_path))
    ds = get_dataset("dukemtmcvidreid", str(tmp_path))
    assert [(len(p), pid, cam) for p, pid, cam in ds.train] == [(3, 0, 0), (2, 0, 4), (1, 1, 1)]
    assert [os.path.basename(p) for p in ds.train[1][0]] == ["0002C5F0009X00007.jpg", "0002C5F0010X00007.jpg"]
    assert ds.train[0][0][0] == os.path.join(base, "train", "0002", "0001", "0002_C1_F0002_X00001.jpg")
    assert [(pid, cam) for _, pid, cam in ds.query] == [(11, 0)]
    assert [(pid, cam) for _, pid, cam in ds.gallery] == [(11, 2), (12, 0)]
    touch(os.path.join(base, "train", "0002", "0001", "frame_a.jpg"))
    with pytest.raises(DatasetFormatError, match=r"frame_a.jpg.*0001_C6_F0099_X30823.jpg"):
        get_dataset("dukemtmcvidreid", str(tmp_path))


def test_video_sets_are_registered_under_torchreid_names():
    for name in ("mars", "ilidsvid", "prid2011", "dukemtmcvidreid", "SyntheticVideoReID"):
        assert DATASET_REGISTRY.get(name).IS_VIDEO
