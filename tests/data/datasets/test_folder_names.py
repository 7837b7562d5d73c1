"""Every dataset is found under its own, fast-reid's and torchreid's folder names (datasets/folders.py)."""

import logging
import os
import shutil

import pytest

from reid_engine.data.datasets import DATASET_REGISTRY, DatasetFormatError, DatasetNotFoundError, get_dataset
from reid_engine.data.datasets.folders import DATASET_FOLDERS, dataset_folders
from tests.data import test_datasets as market_trees
from tests.data.datasets import test_sensereid, test_training_only, test_video_datasets
from tests.data.datasets.fake_trees import make_viper_images, touch_all

# (registered name, accepted folder) for every entry of the table and every registered subclass
# that reads its parent's folders (SmallVehicleID, Market1501_500k, ...).
# The generated sets (Synthetic*) name their own folder.
EVERY_NAME = sorted({(name, folder) for name, _ in DATASET_REGISTRY if not name.startswith("Synthetic")
                     for folder in dataset_folders(DATASET_REGISTRY.get(name))})


def test_the_table_covers_every_registered_benchmark():
    assert {name for name, _ in EVERY_NAME} >= set(DATASET_FOLDERS)
    without = sorted(name for name, _ in DATASET_REGISTRY if not dataset_folders(DATASET_REGISTRY.get(name)))
    # CUHK03 reads its two routes in its own module (cuhk03-np/<boxes>/, and cuhk03/, the folder both peers read);
    # own data and the generated sets have no peer names.
    assert without == ["CUHK03", "CUHK03Detected", "CUHK03Labeled", "ImageFolderReID", "SyntheticReID",
                       "SyntheticReIDShifted", "SyntheticReIDShiftedTiny", "SyntheticReIDTiny"]
    assert DATASET_REGISTRY.get("SyntheticVideoReIDTiny").DATASET_DIRS == ()  # set per instance: its own folder


@pytest.mark.parametrize("name,folder", EVERY_NAME)
def test_each_accepted_name_is_the_folder_read(tmp_path, name, folder):
    """An empty folder under the name: the set is found there and fails on what that folder lacks."""
    root = str(tmp_path)
    os.makedirs(os.path.join(root, folder))
    with pytest.raises((DatasetNotFoundError, DatasetFormatError)) as error:
        DATASET_REGISTRY.get(name)(root=root)
    message = str(error.value)
    assert os.path.join(root, folder) in message and "not found under the data root" not in message


def _duke(root):
    base = os.path.join(root, "DukeMTMC-reID")
    market_trees.touch(os.path.join(base, "bounding_box_train"), "0001_c2_f0046182.jpg", "0005_c8_f0000001.jpg")
    market_trees.touch(os.path.join(base, "query"), "0012_c1_f0000002.jpg")
    market_trees.touch(os.path.join(base, "bounding_box_test"), "0012_c3_f0000003.jpg")


def _veri(root):
    base = os.path.join(root, "VeRi")
    market_trees.touch(os.path.join(base, "image_train"), "0001_c001_00016450_0.jpg")
    market_trees.touch(os.path.join(base, "image_query"), "0002_c002_00030600_1.jpg")
    market_trees.touch(os.path.join(base, "image_test"), "0002_c003_00084120_0.jpg")


def _training_only(name):
    return lambda root: test_training_only.make(name, root)


# name: builds the set under the table's first folder name
BUILDERS = {
    "Market1501": market_trees.make_market,
    "DukeMTMC": _duke,
    "MSMT17": market_trees.make_msmt,
    "VeRi": _veri,
    "SmallVehicleID": market_trees.make_vehicleid,
    "VehicleID": market_trees.make_vehicleid,
    "viper": lambda root: make_viper_images(os.path.join(root, "viper", "VIPeR"), 4),
    "VIPeR": lambda root: make_viper_images(os.path.join(root, "VIPeR"), 4),
    "sensereid": test_sensereid.make,
    "dukemtmcvidreid": test_video_datasets._dukevid_tree,
    **{name: _training_only(name) for name in test_training_only.SETS},
}
PARSED = [(name, folder) for name in sorted(BUILDERS) for folder in dataset_folders(DATASET_REGISTRY.get(name))[1:]]


def _relative(dataset):
    def rel(path):
        return tuple(os.path.relpath(p, dataset.dataset_dir) for p in path) if isinstance(path, tuple) else \
            os.path.relpath(path, dataset.dataset_dir)
    return [[(rel(p), pid, cam) for p, pid, cam in items] for items in (dataset.train, dataset.query, dataset.gallery)]


@pytest.mark.parametrize("name,folder", PARSED)
def test_a_peer_folder_parses_as_ours(tmp_path, name, folder):
    root = str(tmp_path)
    BUILDERS[name](root)
    ours = dataset_folders(DATASET_REGISTRY.get(name))[0]
    key = "DATASETS.TESTS" if name == "sensereid" else "DATASETS.NAMES"
    expected = _relative(get_dataset(name, root, key=key))
    target = os.path.join(root, folder)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.move(os.path.join(root, ours), target + ".moving")  # 'market1501' may be a parent of ours
    if os.path.isdir(target):
        shutil.rmtree(target)
    os.rename(target + ".moving", target)
    dataset = get_dataset(name, root, key=key)
    assert dataset.dataset_dir == target and _relative(dataset) == expected


def test_when_two_exist_the_first_in_order_is_read_and_logged(tmp_path, caplog):
    root = str(tmp_path)
    market_trees.make_market(root, rel="market1501/Market-1501-v15.09.15")
    ours = market_trees.make_market(root)
    with caplog.at_level(logging.INFO, logger="reid_engine.data.datasets.paths"):
        dataset = get_dataset("Market1501", root)
    assert dataset.dataset_dir == ours
    line = next(r.getMessage() for r in caplog.records if "also found" in r.getMessage())
    assert f"reading '{ours}'" in line and os.path.join(root, "market1501", "Market-1501-v15.09.15") in line
    # torchreid's nesting alone: its flat parent 'market1501/' is not a second copy (nothing logged).
    shutil.rmtree(ours)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="reid_engine.data.datasets.paths"):
        assert get_dataset("Market1501", root).dataset_dir.endswith(os.path.join("market1501", "Market-1501-v15.09.15"))
    assert not any("also found" in r.getMessage() for r in caplog.records)


def test_not_found_lists_every_name_and_the_layout(tmp_path):
    with pytest.raises(DatasetNotFoundError) as error:
        get_dataset("MSMT17", str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and "list_train.txt" in message
    for folder in ("MSMT17_V1", "MSMT17_V2", "msmt17/MSMT17_V1", "msmt17/MSMT17_V2"):
        assert f"'{folder}/'" in message


def test_msmt17_version_picks_among_the_peer_names(tmp_path):
    root = str(tmp_path)
    market_trees.make_msmt(root, version="msmt17/MSMT17_V2")
    market_trees.make_msmt(root, version="MSMT17_V1")
    assert get_dataset("MSMT17", root).dataset_dir == os.path.join(root, "MSMT17_V1")
    assert get_dataset("MSMT17", root, version="V2").dataset_dir == os.path.join(root, "msmt17", "MSMT17_V2")


def test_sensereid_probe_folder_in_either_spelling(tmp_path):
    root = str(tmp_path)
    touch_all(os.path.join(root, "SenseReID", "test_probe"), ["0007_0.jpg"])  # the release's spelling
    touch_all(os.path.join(root, "SenseReID", "test_gallery"), ["0007_1.jpg", "0042_1.jpg"])
    assert len(get_dataset("SenseReID", root).train) == 3  # fast-reid's set, which spells it test_prob
    assert len(get_dataset("sensereid", root, key="DATASETS.TESTS").query) == 1


def test_find_dataset_dir_reads_the_table_when_given_no_names(tmp_path):
    from reid_engine.data.datasets.paths import find_dataset_dir

    os.makedirs(os.path.join(str(tmp_path), "veri"))
    assert find_dataset_dir(str(tmp_path), "VeRi", None, "image_train/") == os.path.join(str(tmp_path), "veri")
