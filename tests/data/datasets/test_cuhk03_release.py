"""CUHK03 from its release: a tiny MATLAB v7.3 cuhk-03.mat written with h5py, new-protocol configs written with scipy."""

import logging
import os

import h5py
import numpy as np
import pytest
from PIL import Image
from scipy.io import savemat

from reid_engine.config import ConfigError
from reid_engine.data.datasets import DatasetNotFoundError, cuhk03, get_dataset
from reid_engine.data.datasets.cuhk03 import CropExtractionError, crop_name
from reid_engine.data.datasets.matlab import MatFileError

# Persons per camera pair; the cells left empty (pair, person, column), all 0-based.
PERSONS = (3, 2)
EMPTY = {(0, 1, 4), (1, 0, 9)}
# Classic test sets: (pair, person) 1-based, as in the release's testsets.
TESTSETS = ([(1, 2), (2, 1)], [(1, 1), (2, 2)])


def crop(kind: str, pair: int, person: int, column: int) -> np.ndarray:
    """An 8 x 4 RGB crop whose pixels tell kind, pair, person and column (and the axis order) apart."""
    base = 100 * (kind == "labeled") + 10 * pair + 3 * person + column
    rows, cols = np.mgrid[0:8, 0:4]
    return np.stack([rows * 4 + cols, np.full((8, 4), base), np.full((8, 4), column * 20)], axis=-1).astype(np.uint8)


def write_release(base: str) -> None:
    """``cuhk03_release/cuhk-03.mat`` as MATLAB v7.3 stores it: transposed arrays, cells as object references."""
    os.makedirs(os.path.join(base, "cuhk03_release"))
    with h5py.File(os.path.join(base, "cuhk03_release", "cuhk-03.mat"), "w") as f:
        refs = f.create_group("#refs#")

        def store(array: np.ndarray):
            name = str(len(refs))
            refs[name] = array.T  # MATLAB writes column-major: h5py sees the axes reversed
            return refs[name].ref

        for kind in ("detected", "labeled"):
            pairs = []
            for pair, count in enumerate(PERSONS):
                grid = np.empty((count, 10), dtype=h5py.ref_dtype)
                for person in range(count):
                    for column in range(10):
                        empty = (pair, person, column) in EMPTY
                        grid[person, column] = store(np.zeros(2, np.uint64) if empty else crop(kind, pair, person, column))
                pairs.append(store(grid))
            f.create_dataset(kind, data=np.array([pairs], dtype=h5py.ref_dtype))
        tests = [store(np.array(rows, dtype=float)) for rows in TESTSETS]
        f.create_dataset("testsets", data=np.array([tests], dtype=h5py.ref_dtype))


def write_new_protocol(base: str, kind: str) -> None:
    """A new-protocol config: pair 1 trains, pair 2 is tested (query = view 1, gallery = view 2)."""
    names, labels, train, query, gallery = [], [], [], [], []
    for pair, count in enumerate(PERSONS):
        for person in range(count):
            for column in range(10):
                if (pair, person, column) in EMPTY:
                    continue
                names.append(crop_name(pair, person, column))
                labels.append(sum(PERSONS[:pair]) + person + 1)
                (train if pair == 0 else query if column < 5 else gallery).append(len(names))
    filelist = np.empty((len(names), 1), dtype=object)
    filelist[:, 0] = names
    column = lambda values: np.array(values, dtype=float).reshape(-1, 1)  # noqa: E731
    savemat(os.path.join(base, f"cuhk03_new_protocol_config_{kind}.mat"),
            {"filelist": filelist, "labels": column(labels), "train_idx": column(train), "query_idx": column(query),
             "gallery_idx": column(gallery), "camId": column([1] * len(names))})


@pytest.fixture
def release(tmp_path):
    base = os.path.join(str(tmp_path), "cuhk03")
    write_release(base)
    for kind in ("detected", "labeled"):
        write_new_protocol(base, kind)
    return str(tmp_path), base


def names(items):
    return sorted((os.path.basename(path), pid, camid) for path, pid, camid in items)


def test_new_protocol_extracts_the_crops_once(release, caplog, monkeypatch):
    root, base = release
    monkeypatch.setattr(cuhk03, "PROGRESS_PERIOD", 0.0)  # a progress line after every person
    with caplog.at_level(logging.INFO, logger="reid_engine.data.datasets.cuhk03"):
        ds = get_dataset("CUHK03Detected", root)
    assert "wrote 48 detected crops" in caplog.text
    assert "extracting the detected crops, 10 / 50 cells, ETA" in caplog.text
    assert sorted(os.listdir(base)) == ["cuhk03_new_protocol_config_detected.mat", "cuhk03_new_protocol_config_labeled.mat",
                                        "cuhk03_release", "images_detected"]  # labeled not asked for, not extracted
    assert len(os.listdir(os.path.join(base, "images_detected"))) == 50 - len(EMPTY)
    # crops come back pixel for pixel, in MATLAB's row / column order
    path = os.path.join(base, "images_detected", "2_001_2_07.png")
    np.testing.assert_array_equal(np.asarray(Image.open(path)), crop("detected", 1, 0, 6))
    # pair 1 trains (relabelled, camid = view - 1); pair 2's people keep their config labels 4 and 5
    assert (ds.num_train_pids, len(ds.train), ds.num_train_cams) == (3, 29, 2)
    assert names(ds.query) == [(crop_name(1, p, c), 4 + p, 0) for p in range(2) for c in range(5)]
    assert names(ds.gallery) == [(crop_name(1, p, c), 4 + p, 1) for p in range(2) for c in range(5, 10)
                                 if (1, p, c) not in EMPTY]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="reid_engine.data.datasets.cuhk03"):
        again = get_dataset("CUHK03Detected", root)
    assert "extracting" not in caplog.text and names(again.train) == names(ds.train)
    labeled = get_dataset("CUHK03Labeled", root)
    assert os.path.basename(os.path.dirname(labeled.train[0][0])) == "images_labeled"
    # extracted folders (ours or a peer's) serve the new protocol without cuhk-03.mat; the classic splits need it
    os.remove(os.path.join(base, "cuhk03_release", "cuhk-03.mat"))
    assert names(get_dataset("CUHK03Detected", root).query) == names(ds.query)
    with pytest.raises(DatasetNotFoundError, match=r"missing file .*cuhk-03.mat"):
        get_dataset("CUHK03Detected:classic", root)


def test_classic_splits_follow_split_id(release):
    root, base = release
    ds = get_dataset("CUHK03Detected:classic", root)  # split 0: pair 1 person 2 and pair 2 person 1 are tested
    assert ds.query == ds.gallery
    assert sorted({pid for _, pid, _ in ds.query}) == [1002, 2001]
    assert {(name[:5], cam) for name, _, cam in names(ds.query)} == {("1_002", 0), ("1_002", 1), ("2_001", 0),
                                                                     ("2_001", 1)}
    assert (ds.num_train_pids, len(ds.train)) == (3, 30)
    other = get_dataset("CUHK03Labeled:classic", root, split_id=1)
    assert sorted({pid for _, pid, _ in other.query}) == [1001, 2002]
    assert os.path.basename(os.path.dirname(other.query[0][0])) == "images_labeled"
    with pytest.raises(ConfigError, match=r"DATASETS.SPLIT_ID 2 is out of range for CUHK03Detected: it has 2 splits"):
        get_dataset("CUHK03Detected:classic", root, split_id=2)
    with pytest.raises(ConfigError, match="unknown CUHK03 protocol 'old'"):
        get_dataset("CUHK03Detected:old", root)


def test_an_interrupted_extraction_leaves_nothing_behind(release, monkeypatch):
    root, base = release
    saved, real_save = [], Image.Image.save

    def failing_save(image, path, *args, **kwargs):
        if len(saved) == 5:
            raise OSError(28, "No space left on device")
        saved.append(path)
        real_save(image, path, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", failing_save)
    with pytest.raises(CropExtractionError, match="cannot write the extracted crops to .*images_detected"):
        get_dataset("CUHK03Detected", root)
    assert sorted(os.listdir(base)) == ["cuhk03_new_protocol_config_detected.mat", "cuhk03_new_protocol_config_labeled.mat",
                                        "cuhk03_release"]
    monkeypatch.undo()
    assert len(get_dataset("CUHK03Detected", root).train) == 29


def test_missing_or_damaged_release_files_are_one_line_errors(tmp_path, release):
    with pytest.raises(DatasetNotFoundError, match=r"expected 'cuhk03-np/labeled/' \(Market-style folders\) or "
                                                    r"'cuhk03/'"):
        get_dataset("CUHK03", str(tmp_path / "empty"))
    root, base = release
    os.remove(os.path.join(base, "cuhk03_new_protocol_config_detected.mat"))
    with pytest.raises(DatasetNotFoundError, match="missing file .*cuhk03_new_protocol_config_detected.mat"):
        get_dataset("CUHK03Detected", root)
    mat = os.path.join(base, "cuhk03_release", "cuhk-03.mat")
    with open(mat, "wb") as f:
        f.write(b"not hdf5")
    with pytest.raises(MatFileError, match=r"cannot read the MATLAB v7.3 file '.*cuhk-03.mat'") as err:
        get_dataset("CUHK03Labeled", root)
    assert "\n" not in str(err.value)
    assert not os.path.exists(os.path.join(base, "images_labeled"))


def test_the_cuhk03_np_folders_come_first(release, caplog):
    root, _ = release
    for split, name in (("bounding_box_train", "0001_c1_1.png"), ("bounding_box_train", "0001_c2_1.png"),
                        ("query", "0100_c1_1.png"), ("bounding_box_test", "0100_c2_3.png")):
        folder = os.path.join(root, "cuhk03-np", "detected", split)
        os.makedirs(folder, exist_ok=True)
        Image.new("RGB", (4, 8)).save(os.path.join(folder, name))
    with caplog.at_level(logging.INFO, logger="reid_engine.data.datasets.cuhk03"):
        ds = get_dataset("CUHK03Detected", root)
    assert len(ds.train) == 2 and "reading 'cuhk03-np/detected/'" in caplog.text
    assert len(get_dataset("CUHK03Detected:classic", root).query) == 18  # the classic splits exist only in the release


def test_plain_cuhk03_reads_the_labelled_boxes_as_fastreid_does(release):
    root, base = release
    ds = get_dataset("CUHK03", root)
    assert {os.path.basename(os.path.dirname(path)) for path, _, _ in ds.train + ds.query} == {"images_labeled"}
    assert sorted(os.listdir(base))[-1] == "images_labeled" and "images_detected" not in os.listdir(base)
    np.testing.assert_array_equal(np.asarray(Image.open(os.path.join(base, "images_labeled", "2_001_2_07.png"))),
                                  crop("labeled", 1, 0, 6))
