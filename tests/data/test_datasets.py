"""Benchmark parsers, own-data datasets, COMBINEALL and training-set merging on fake trees.

Image files are empty: parsing reads names and lists only, never pixels.
"""

import logging
import os
import shutil

import pytest

from reid_engine.config import ConfigError
from reid_engine.data.datasets import (
    DATASET_REGISTRY,
    DatasetFormatError,
    DatasetNotFoundError,
    ImageDataset,
    get_dataset,
    merge_train_sets,
    resolve_data_root,
)
from reid_engine.data.datasets.vehicleid import split_query_gallery
from reid_engine.utils.registry import UnknownChoiceError


def touch(folder, *names):
    """Create empty files ``names`` in ``folder`` (created if needed)."""
    os.makedirs(folder, exist_ok=True)
    for name in names:
        open(os.path.join(folder, name), "w").close()


def write(path, text):
    """Write ``text`` to ``path``, creating parent folders."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def triples(items):
    """``(basename, pid, camid)`` of items, sorted, for exact comparisons."""
    return sorted((os.path.basename(p), pid, cam) for p, pid, cam in items)


# ---------------------------------------------------------------- Market-style benchmarks

MARKET_TRAIN = ["0002_c1s1_000451_03.jpg", "0002_c2s1_000551_01.jpg", "0007_c3s3_077419_01.jpg",
                "0007_c6s1_000676_02.jpg", "0010_c5s2_000001_01.jpg"]
MARKET_QUERY = ["0003_c1s1_000001_00.jpg", "0004_c2s1_000101_00.jpg"]
MARKET_GALLERY = ["-1_c1s1_000401_03.jpg", "0000_c4s1_000301_05.jpg", "0003_c2s1_000201_01.jpg",
                  "0003_c1s1_000302_02.jpg", "0004_c2s1_000151_02.jpg", "0004_c6s1_000201_01.jpg"]


def make_market(root, rel="Market-1501-v15.09.15", distractors=False):
    """A fake Market-1501 tree (junk -1, distractor 0, six cameras) under ``root/rel``."""
    base = os.path.join(root, rel)
    touch(os.path.join(base, "bounding_box_train"), *MARKET_TRAIN, "Thumbs.db")
    touch(os.path.join(base, "query"), *MARKET_QUERY)
    touch(os.path.join(base, "bounding_box_test"), *MARKET_GALLERY)
    if distractors:
        touch(os.path.join(base, "images"), "0000_c3s1_100001_00.jpg", "-1_c2s1_1_00.jpg",
              "0001_c5s2_100002_00.jpg")
    return base


def test_market1501_pids_camids_junk_and_distractors(tmp_path):
    make_market(str(tmp_path))
    ds = DATASET_REGISTRY.get("Market1501")(root=str(tmp_path))
    # Train pids 2, 7, 10 relabelled to 0, 1, 2; camera cN -> camid N - 1.
    assert triples(ds.train) == [
        ("0002_c1s1_000451_03.jpg", 0, 0), ("0002_c2s1_000551_01.jpg", 0, 1),
        ("0007_c3s3_077419_01.jpg", 1, 2), ("0007_c6s1_000676_02.jpg", 1, 5),
        ("0010_c5s2_000001_01.jpg", 2, 4)]
    assert triples(ds.query) == [("0003_c1s1_000001_00.jpg", 3, 0),
                                 ("0004_c2s1_000101_00.jpg", 4, 1)]
    # Junk (-1) dropped, distractor (0) kept with original pids.
    assert triples(ds.gallery) == [
        ("0000_c4s1_000301_05.jpg", 0, 3), ("0003_c1s1_000302_02.jpg", 3, 0),
        ("0003_c2s1_000201_01.jpg", 3, 1), ("0004_c2s1_000151_02.jpg", 4, 1),
        ("0004_c6s1_000201_01.jpg", 4, 5)]
    assert (ds.num_train_pids, ds.num_train_cams) == (3, 5)
    assert ds.summary_rows() == [["train", 3, 5, 5], ["query", 2, 2, 2], ["gallery", 3, 5, 4]]


def test_market1501_alternative_folder_and_500k_distractors(tmp_path):
    make_market(str(tmp_path), rel="market1501/Market-1501-v15.09.15", distractors=True)
    plain = get_dataset("Market1501", str(tmp_path))
    big = get_dataset("Market1501_500k", str(tmp_path))
    assert len(plain.gallery) == 5
    extra = set(triples(big.gallery)) - set(triples(plain.gallery))
    # Distractor images all become pid 0; their camera comes from the name; junk names skipped.
    assert extra == {("0000_c3s1_100001_00.jpg", 0, 2), ("0001_c5s2_100002_00.jpg", 0, 4)}
    assert len(big.gallery) == 7
    assert triples(big.train) == triples(plain.train)


def test_market500k_without_images_folder_is_a_clear_error(tmp_path):
    make_market(str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match="images"):
        get_dataset("Market1501", str(tmp_path), market500k=True)


def test_missing_dataset_names_root_layout_and_fix(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        get_dataset("Market1501", str(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg
    for part in (str(tmp_path), "Market-1501-v15.09.15/", "bounding_box_train/", "query/",
                 "bounding_box_test/", "DATASETS.ROOT", "$REID_DATASETS"):
        assert part in msg


def test_missing_split_folder_is_named(tmp_path):
    base = make_market(str(tmp_path))
    shutil.rmtree(os.path.join(base, "query"))
    with pytest.raises(DatasetNotFoundError, match=r"missing folder .*query"):
        get_dataset("Market1501", str(tmp_path))


def test_badly_named_image_is_reported_with_its_path(tmp_path):
    base = make_market(str(tmp_path))
    touch(os.path.join(base, "query"), "holiday.jpg")
    with pytest.raises(DatasetFormatError, match="holiday.jpg"):
        get_dataset("Market1501", str(tmp_path))


def test_dukemtmc(tmp_path):
    base = os.path.join(str(tmp_path), "DukeMTMC-reID")
    touch(os.path.join(base, "bounding_box_train"), "0001_c2_f0046182.jpg", "0001_c5_f0051341.jpg",
          "0005_c8_f0000001.jpg")
    touch(os.path.join(base, "query"), "0012_c1_f0000002.jpg")
    touch(os.path.join(base, "bounding_box_test"), "0012_c3_f0000003.jpg", "0013_c1_f0000004.jpg")
    ds = get_dataset("DukeMTMC", str(tmp_path))
    assert triples(ds.train) == [("0001_c2_f0046182.jpg", 0, 1), ("0001_c5_f0051341.jpg", 0, 4),
                                 ("0005_c8_f0000001.jpg", 1, 7)]
    assert triples(ds.query) == [("0012_c1_f0000002.jpg", 12, 0)]
    assert triples(ds.gallery) == [("0012_c3_f0000003.jpg", 12, 2),
                                   ("0013_c1_f0000004.jpg", 13, 0)]


@pytest.mark.parametrize("name,kwargs,sub", [("CUHK03", {}, "labeled"),  # fast-reid's CUHK03 is the labelled boxes
                                             ("CUHK03", {"labeled": False}, "detected"),
                                             ("CUHK03Labeled", {}, "labeled"),
                                             ("CUHK03Detected", {}, "detected")])
def test_cuhk03_detected_and_labeled(tmp_path, name, kwargs, sub):
    for which, pid in (("detected", 1), ("labeled", 2)):
        base = os.path.join(str(tmp_path), "cuhk03-np", which)
        touch(os.path.join(base, "bounding_box_train"), f"{pid:04d}_c1_1.png",
              f"{pid:04d}_c2_2.png")
        touch(os.path.join(base, "query"), "0100_c1_1.png")
        touch(os.path.join(base, "bounding_box_test"), "0100_c2_3.png")
    ds = get_dataset(name, str(tmp_path), **kwargs)
    assert os.path.basename(os.path.dirname(os.path.dirname(ds.train[0][0]))) == sub
    pid = 1 if sub == "detected" else 2
    assert triples(ds.train) == [(f"{pid:04d}_c1_1.png", 0, 0), (f"{pid:04d}_c2_2.png", 0, 1)]
    assert triples(ds.gallery) == [("0100_c2_3.png", 100, 1)]


def test_veri(tmp_path):
    base = os.path.join(str(tmp_path), "VeRi")
    touch(os.path.join(base, "image_train"), "0001_c001_00016450_0.jpg", "0001_c012_00016460_0.jpg",
          "0004_c002_00016470_0.jpg")
    touch(os.path.join(base, "image_query"), "0002_c002_00030600_1.jpg")
    touch(os.path.join(base, "image_test"), "0002_c003_00084120_0.jpg", "0006_c002_0_0.jpg")
    ds = get_dataset("VeRi", str(tmp_path), combineall=True)
    assert triples(ds.query) == [("0002_c002_00030600_1.jpg", 2, 1)]
    # COMBINEALL: test vehicles 2 and 6 become training ids 2 and 3 (no distractor value).
    assert triples(ds.train) == [
        ("0001_c001_00016450_0.jpg", 0, 0), ("0001_c012_00016460_0.jpg", 0, 11),
        ("0002_c002_00030600_1.jpg", 2, 1), ("0002_c003_00084120_0.jpg", 2, 2),
        ("0004_c002_00016470_0.jpg", 1, 1), ("0006_c002_0_0.jpg", 3, 1)]


# ----------------------------------------------------------------------------- MSMT17

def make_msmt(root, version="MSMT17_V1", train_dir="train", test_dir="test"):
    """A fake MSMT17 tree with list files (pid 0 is a real id in MSMT17)."""
    base = os.path.join(root, version)
    train = ["0000/0000_000_01_0303morning_0015_0.jpg", "0000/0000_001_05_0303morning_0016_0.jpg",
             "0001/0001_000_15_0303noon_0017_0.jpg"]
    val = ["0001/0001_002_03_0303noon_0018_0.jpg"]
    query = ["0000/0000_000_02_0303afternoon_0001_0.jpg"]
    gallery = ["0000/0000_001_07_0303afternoon_0002_0.jpg", "0003/0003_000_02_0303night_0003_0.jpg"]
    for rel in train + val:
        touch(os.path.join(base, train_dir, os.path.dirname(rel)), os.path.basename(rel))
    for rel in query + gallery:
        touch(os.path.join(base, test_dir, os.path.dirname(rel)), os.path.basename(rel))

    def lst(rels):
        return "".join(f"{r} {int(r[:4])}\n" for r in rels)

    write(os.path.join(base, "list_train.txt"), lst(train))
    write(os.path.join(base, "list_val.txt"), lst(val))
    write(os.path.join(base, "list_query.txt"), lst(query))
    write(os.path.join(base, "list_gallery.txt"), lst(gallery))
    return base


def test_msmt17_v1_lists_and_camids(tmp_path):
    make_msmt(str(tmp_path))
    ds = get_dataset("MSMT17", str(tmp_path))
    assert triples(ds.train) == [("0000_000_01_0303morning_0015_0.jpg", 0, 0),
                                 ("0000_001_05_0303morning_0016_0.jpg", 0, 4),
                                 ("0001_000_15_0303noon_0017_0.jpg", 1, 14)]
    assert triples(ds.query) == [("0000_000_02_0303afternoon_0001_0.jpg", 0, 1)]
    assert triples(ds.gallery) == [("0000_001_07_0303afternoon_0002_0.jpg", 0, 6),
                                   ("0003_000_02_0303night_0003_0.jpg", 3, 1)]
    assert ds.train[0][0].endswith(os.path.join("MSMT17_V1", "train", "0000",
                                                "0000_000_01_0303morning_0015_0.jpg"))


def test_msmt17_combineall_adds_val_and_test_ids(tmp_path):
    make_msmt(str(tmp_path), version="MSMT17_V2", train_dir="mask_train_v2",
              test_dir="mask_test_v2")
    ds = get_dataset("MSMT17", str(tmp_path), combineall=True)
    # train 3 + val 1 (same id space as train) + query 1 + gallery 2 = 7 images;
    # ids: train {0, 1} -> 0, 1; test {0, 3} (pid 0 is a real MSMT17 id) -> 2, 3.
    assert len(ds.train) == 7
    assert ds.num_train_pids == 4
    assert ("0001_002_03_0303noon_0018_0.jpg", 1, 2) in triples(ds.train)
    assert ("0000_000_02_0303afternoon_0001_0.jpg", 2, 1) in triples(ds.train)
    assert ("0003_000_02_0303night_0003_0.jpg", 3, 1) in triples(ds.train)


def test_msmt17_missing_listed_image_is_reported(tmp_path):
    base = make_msmt(str(tmp_path))
    os.remove(os.path.join(base, "test", "0003", "0003_000_02_0303night_0003_0.jpg"))
    with pytest.raises(DatasetNotFoundError, match="0003_000_02_0303night_0003_0.jpg"):
        get_dataset("MSMT17", str(tmp_path))


# -------------------------------------------------------------------------- VehicleID

def make_vehicleid(root):
    """A fake VehicleID tree: 3 train vehicles, test vehicles 10 (3 images), 11 (2), 12 (1)."""
    base = os.path.join(root, "VehicleID_V1.0")
    train = [("0000001", 1), ("0000002", 1), ("0000003", 2), ("0000004", 5)]
    test = [("0000101", 10), ("0000102", 10), ("0000103", 10), ("0000104", 11), ("0000105", 11),
            ("0000106", 12)]
    touch(os.path.join(base, "image"), *(n + ".jpg" for n, _ in train + test))
    split = os.path.join(base, "train_test_split")
    write(os.path.join(split, "train_list.txt"), "".join(f"{n} {v}\n" for n, v in train))
    for size in (800, 1600, 2400, 13164):
        rows = test if size in (800, 13164) else test[:5]
        write(os.path.join(split, f"test_list_{size}.txt"), "".join(f"{n} {v}\n" for n, v in rows))
    return base


def test_vehicleid_protocol(tmp_path):
    make_vehicleid(str(tmp_path))
    ds = get_dataset("VehicleID", str(tmp_path))
    assert triples(ds.train) == [("0000001.jpg", 0, 0), ("0000002.jpg", 0, 0),
                                 ("0000003.jpg", 1, 0), ("0000004.jpg", 2, 0)]
    # One gallery image per test vehicle; the others are queries with distinct pseudo cameras.
    assert sorted(pid for _, pid, _ in ds.gallery) == [10, 11, 12]
    assert all(cam == 0 for _, _, cam in ds.gallery)
    assert sorted((pid, cam) for _, pid, cam in ds.query) == [(10, 1), (10, 2), (11, 1)]
    assert len({p for p, _, _ in ds.query + ds.gallery}) == 6
    again = get_dataset("SmallVehicleID", str(tmp_path))
    assert triples(again.gallery) == triples(ds.gallery)  # fixed seed


def test_vehicleid_sizes(tmp_path):
    make_vehicleid(str(tmp_path))
    for name in ("MediumVehicleID", "LargeVehicleID"):
        ds = get_dataset(name, str(tmp_path))
        assert sorted(pid for _, pid, _ in ds.gallery) == [10, 11]
        assert len(ds.query) == 3
    with pytest.raises(ValueError, match="test_size"):
        get_dataset("VehicleID", str(tmp_path), test_size=123)


def test_plain_vehicleid_tests_on_the_13164_list_as_fast_reid(tmp_path):
    base = make_vehicleid(str(tmp_path))
    split = os.path.join(base, "train_test_split")
    # The full list: vehicles 10 and 11 only; test_list_800 keeps 10, 11 and 12.
    write(os.path.join(split, "test_list_13164.txt"), "0000101 10\n0000102 10\n0000104 11\n0000105 11\n")
    plain, small = get_dataset("VehicleID", str(tmp_path)), get_dataset("SmallVehicleID", str(tmp_path))
    assert sorted(pid for _, pid, _ in plain.gallery) == [10, 11] and len(plain.query) == 2
    assert sorted(pid for _, pid, _ in small.gallery) == [10, 11, 12] and len(small.query) == 3
    assert triples(plain.train) == triples(small.train)
    assert get_dataset("VehicleID", str(tmp_path), test_size=800).gallery == small.gallery
    os.remove(os.path.join(split, "test_list_13164.txt"))
    with pytest.raises(DatasetNotFoundError, match="test_list_13164.txt"):
        get_dataset("VehicleID", str(tmp_path))


def test_vehicleid_gallery_pick_is_seeded():
    pairs = [(f"{i}.jpg", i // 4) for i in range(40)]
    q1, g1 = split_query_gallery(pairs, seed=0)
    q2, g2 = split_query_gallery(pairs, seed=0)
    q3, g3 = split_query_gallery(pairs, seed=1)
    assert (q1, g1) == (q2, g2) and g1 != g3
    assert len(g1) == 10 and len(q1) == 30


# ----------------------------------------------------------------------- your own data

def test_image_folder_identity_folders(tmp_path):
    base = os.path.join(str(tmp_path), "my_shop")
    touch(os.path.join(base, "train", "alice"), "alice_c1_001.jpg", "alice_c3_002.jpg")
    touch(os.path.join(base, "train", "bob"), "cam2_x.png")
    touch(os.path.join(base, "query", "carol"), "carol_c1_1.jpg")
    touch(os.path.join(base, "gallery", "carol"), "carol_c2_1.jpg")
    touch(os.path.join(base, "gallery", "0"), "stranger_c1_1.jpg")
    touch(os.path.join(base, "gallery", "-1"), "blurry_c1_1.jpg")
    ds = get_dataset("ImageFolder:my_shop", str(tmp_path))
    assert ds.name == "ImageFolder:my_shop"
    # Names numbered 1.. in sorted order over all splits (alice 1, bob 2, carol 3); "0" stays
    # the distractor; "-1" is junk. Cameras 1, 2, 3 -> 0, 1, 2.
    assert triples(ds.train) == [("alice_c1_001.jpg", 0, 0), ("alice_c3_002.jpg", 0, 2),
                                 ("cam2_x.png", 1, 1)]
    assert triples(ds.query) == [("carol_c1_1.jpg", 3, 0)]
    assert triples(ds.gallery) == [("carol_c2_1.jpg", 3, 1), ("stranger_c1_1.jpg", 0, 0)]


def test_image_folder_csv_and_txt_lists(tmp_path):
    base = os.path.join(str(tmp_path), "lists")
    touch(os.path.join(base, "img"), *(f"{i}.jpg" for i in range(6)))
    write(os.path.join(base, "train.csv"), "path,id,camera\nimg/0.jpg,17,door\nimg/1.jpg,17,lift\n"
                                           "# a comment\n\nimg/2.jpg,42,door\n")
    write(os.path.join(base, "query.txt"), "img/3.jpg 5 door\n")
    write(os.path.join(base, "gallery.csv"), "img/4.jpg,5,lift\nimg/5.jpg,-1,lift\n")
    ds = get_dataset("ImageFolderReID:lists", str(tmp_path))
    # Integer ids keep their values; cameras numbered in sorted order: door 0, lift 1.
    assert triples(ds.train) == [("0.jpg", 0, 0), ("1.jpg", 0, 1), ("2.jpg", 1, 0)]
    assert triples(ds.query) == [("3.jpg", 5, 0)]
    assert triples(ds.gallery) == [("4.jpg", 5, 1)]


def test_image_folder_errors(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="nowhere"):
        get_dataset("ImageFolder:nowhere", str(tmp_path))
    base = os.path.join(str(tmp_path), "nocam")
    for split in ("train", "query", "gallery"):
        touch(os.path.join(base, split, "7"), "photo.jpg")
    with pytest.raises(DatasetFormatError, match="no camera in image name .*photo.jpg"):
        get_dataset("ImageFolder:nocam", str(tmp_path))
    base = os.path.join(str(tmp_path), "badcsv")
    touch(base, "a.jpg")
    for split in ("train", "query", "gallery"):
        write(os.path.join(base, f"{split}.csv"), "a.jpg,1\n")
    with pytest.raises(DatasetFormatError, match="line 1 .* expected 3"):
        get_dataset("ImageFolder:badcsv", str(tmp_path))


def test_one_camera_test_set_explains_the_cause(tmp_path):
    base = os.path.join(str(tmp_path), "onecam")
    for split in ("train", "query", "gallery"):
        touch(os.path.join(base, split, "1"), "x_c1_1.jpg", "x_c1_2.jpg")
    with pytest.raises(DatasetFormatError, match="every image shares one camera id"):
        get_dataset("ImageFolder:onecam", str(tmp_path))


# --------------------------------------------------------- base class, merge, registry

def test_empty_split_is_a_clear_error():
    with pytest.raises(DatasetFormatError, match="the query split is empty"):
        ImageDataset([("a", 1, 0)], [], [("b", 1, 1)], "Tiny")


def test_combineall_excludes_distractors_and_keeps_test_ids_apart():
    train = [("t1", 5, 0), ("t2", 9, 1)]
    query = [("q1", 5, 0)]  # same number as a train id, but a different person
    gallery = [("g1", 5, 1), ("g2", 0, 1), ("g3", 8, 0)]
    ds = ImageDataset(train, query, gallery, "Toy", combineall=True)
    assert sorted(ds.train) == [("g1", 2, 1), ("g3", 3, 0), ("q1", 2, 0), ("t1", 0, 0),
                                ("t2", 1, 1)]
    assert ds.num_train_pids == 4
    assert ImageDataset(train, query, gallery, "Toy").num_train_pids == 2


def test_merge_train_sets_prefixes_ids_and_cameras():
    a = ImageDataset([("a1", 3, 0), ("a2", 7, 1)], [("q", 1, 0)], [("g", 1, 1)], "Market1501")
    b = ImageDataset([("b1", 3, 0), ("b2", 3, 2)], [("q", 1, 0)], [("g", 1, 1)], "DukeMTMC")
    items, num_classes, num_cams = merge_train_sets([a, b])
    # Market ids 0, 1 and cams 0, 1; Duke's id 0 (pid 3) -> 2, its cams 0, 2 -> 2, 3.
    assert items == [("a1", 0, 0), ("a2", 1, 1), ("b1", 2, 2), ("b2", 2, 3)]
    assert (num_classes, num_cams) == (3, 4)
    with pytest.raises(ValueError, match="given twice"):
        merge_train_sets([a, a])


def test_get_dataset_errors_and_summary(tmp_path, caplog):
    with pytest.raises(UnknownChoiceError, match="unknown DATASETS.NAMES 'Nope': choose one of .*ImageFolder:"):
        get_dataset("Nope", str(tmp_path))
    with pytest.raises(UnknownChoiceError, match="unknown DATASETS.TESTS 'market1501'.*did you mean Market1501[?]"):
        get_dataset("market1501", str(tmp_path), key="DATASETS.TESTS")
    make_market(str(tmp_path))
    with pytest.raises(ConfigError, match="takes no ':<value>'"):
        get_dataset("Market1501:x", str(tmp_path))
    with caplog.at_level(logging.INFO):
        get_dataset("Market1501", str(tmp_path))
    assert "# ids" in caplog.text and "gallery" in caplog.text


def test_registry_has_every_benchmark():
    for name in ("Market1501", "Market1501_500k", "DukeMTMC", "MSMT17", "CUHK03",
                 "CUHK03Labeled", "CUHK03Detected", "VeRi", "VehicleID", "SmallVehicleID", "MediumVehicleID",
                 "LargeVehicleID", "ImageFolderReID", "SyntheticReID", "SyntheticReIDTiny"):
        assert name in DATASET_REGISTRY


def test_resolve_data_root(monkeypatch):
    monkeypatch.setenv("REID_DATASETS", "/data/reid")
    assert resolve_data_root("") == "/data/reid"
    assert resolve_data_root("/elsewhere") == "/elsewhere"
    monkeypatch.delenv("REID_DATASETS")
    assert resolve_data_root("") == "./datasets"
