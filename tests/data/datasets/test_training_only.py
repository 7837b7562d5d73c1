"""fast-reid's training-only sets: ids and cameras read where fast-reid reads them, on fake trees."""

import os

import pytest

from reid_engine.config import ConfigError, get_cfg
from reid_engine.data.build import check_data_config
from reid_engine.data.datasets import (
    DATASET_REGISTRY,
    DatasetFormatError,
    DatasetNotFoundError,
    collect_file_problems,
    get_dataset,
    merge_train_sets,
)
from reid_engine.data.datasets.catalog import dataset_class
from reid_engine.data.datasets.training_only import TRAINING_ONLY_SETS
from tests.data.datasets.fake_trees import numbered, relative, touch, touch_all, write

AIRPORT_LIST = "cam1\\11001\\a.jpg\ncam1\\11001\\b.jpg\r\ncam2\\11005\\c.jpg\ncam2\\10999\\d.jpg\n\n"

# name: (files under the root, expected (path under the root, id text, camera text), a file that
# breaks the name rule (or None), words of the rule the error must show)
SETS = {
    "cuhkSYSU": (
        ["cuhk_sysu/cropped_images/p11422_s16929_1.jpg", "cuhk_sysu/cropped_images/p11422_s16930_2.jpg",
         "cuhk_sysu/cropped_images/p00007_s1_1.jpg", "cuhk_sysu/cropped_images/p8_s2_1.png"],
        [("cuhk_sysu/cropped_images/p11422_s16929_1.jpg", "11422", "0"),
         ("cuhk_sysu/cropped_images/p11422_s16930_2.jpg", "11422", "0"),
         ("cuhk_sysu/cropped_images/p00007_s1_1.jpg", "7", "0")],  # int: the padding is dropped
        "cuhk_sysu/cropped_images/scene.jpg", "p<pid>_s<scene>_<k>.jpg"),
    "AirportALERT": (
        ["AirportALERT/cam1/11001/a.jpg", "AirportALERT/cam1/11001/b.jpg", "AirportALERT/cam2/11005/c.jpg",
         "AirportALERT/cam2/10999/d.jpg"],
        [("AirportALERT/cam1/11001/a.jpg", "11001", "cam1"), ("AirportALERT/cam1/11001/b.jpg", "11001", "cam1"),
         ("AirportALERT/cam2/11005/c.jpg", "11005", "cam2")],  # pid 10999 < 11001 is left out
        None, ""),
    "iLIDS": (
        ["iLIDS/person001/cam1_person001_00317.png", "iLIDS/person001/cam2_person001_00400.png",
         "iLIDS/person002/cam1_person002_00001.png", "iLIDS/stray.png"],
        [("iLIDS/person001/cam1_person001_00317.png", "person001", "cam1"),
         ("iLIDS/person001/cam2_person001_00400.png", "person001", "cam2"),
         ("iLIDS/person002/cam1_person002_00001.png", "person002", "cam1")],
        "iLIDS/person002/nocamera.png", "<camera>_"),
    "PKU": (
        ["PKUv1a_128x48/0001_1_01.png", "PKUv1a_128x48/0001_2_01.png", "PKUv1a_128x48/0002_1_05.png"],
        [("PKUv1a_128x48/0001_1_01.png", "0001", "1"), ("PKUv1a_128x48/0001_2_01.png", "0001", "2"),
         ("PKUv1a_128x48/0002_1_05.png", "0002", "1")],
        "PKUv1a_128x48/lonely.png", "<pid>_<camera>_"),
    "PRAI": (
        ["PRAI-1581/images/0001_1_a.jpg", "PRAI-1581/images/0003_2_b.jpg"],
        [("PRAI-1581/images/0001_1_a.jpg", "0001", "1"), ("PRAI-1581/images/0003_2_b.jpg", "0003", "2")],
        "PRAI-1581/images/nofields.jpg", "<pid>_<camera>_"),
    "PRID": (
        ["prid_2011/slim_train/person_0001/a_0001.png", "prid_2011/slim_train/person_0001/b_0001.png",
         "prid_2011/slim_train/deeper/person_0002/a_0007.png", "prid_2011/slim_train/person_0003/0001.png"],
        [("prid_2011/slim_train/person_0001/a_0001.png", "0001", "a"),
         ("prid_2011/slim_train/person_0001/b_0001.png", "0001", "b"),
         ("prid_2011/slim_train/deeper/person_0002/a_0007.png", "0002", "a"),
         ("prid_2011/slim_train/person_0003/0001.png", "0003", "0001.png")],  # no '_': the whole name
        "prid_2011/slim_train/loose/a_1.png", "person_<pid>"),
    "GRID": (
        ["underground_reid/images/0005_2_25100_229_94_99_249.jpeg", "underground_reid/images/0005_5_1_1_1_1_1.jpeg",
         "underground_reid/images/0000_1_2_2_2_2_2.jpeg", "underground_reid/images/0000_8_3_3_3_3_3.jpeg"],
        [("underground_reid/images/0005_2_25100_229_94_99_249.jpeg", "0005", "2"),
         ("underground_reid/images/0005_5_1_1_1_1_1.jpeg", "0005", "5"),
         ("underground_reid/images/0000_1_2_2_2_2_2.jpeg", "0000", "1"),  # unpaired people: one id
         ("underground_reid/images/0000_8_3_3_3_3_3.jpeg", "0000", "8")],
        "underground_reid/images/x.jpeg", "<pid>_<camera>_"),
    "SAIVT": (
        ["SAIVT-SoftBio/cropped_images/Subject001/S001-Seq01-Camera3-0001.jpeg",
         "SAIVT-SoftBio/cropped_images/Subject001/S001-Seq01-Camera5-0002.jpeg",
         "SAIVT-SoftBio/cropped_images/Subject002/S002-Seq02-Camera3-0001.jpeg"],
        [("SAIVT-SoftBio/cropped_images/Subject001/S001-Seq01-Camera3-0001.jpeg", "Subject001", "Camera3"),
         ("SAIVT-SoftBio/cropped_images/Subject001/S001-Seq01-Camera5-0002.jpeg", "Subject001", "Camera5"),
         ("SAIVT-SoftBio/cropped_images/Subject002/S002-Seq02-Camera3-0001.jpeg", "Subject002", "Camera3")],
        "SAIVT-SoftBio/cropped_images/Subject002/short-name.jpeg", "<camera>"),
    "SenseReID": (
        ["SenseReID/test_gallery/0001_0.jpg", "SenseReID/test_prob/0001_1.jpg", "SenseReID/test_prob/0002_1.jpg"],
        [("SenseReID/test_gallery/0001_0.jpg", "0001", "0"), ("SenseReID/test_prob/0001_1.jpg", "0001", "1"),
         ("SenseReID/test_prob/0002_1.jpg", "0002", "1")],
        "SenseReID/test_prob/photo.jpg", "<pid>_<camera>.jpg"),
    "SYSU_mm": (
        ["SYSU-MM01/cam1/0001/0001.jpg", "SYSU-MM01/cam2/0001/0002.jpg", "SYSU-MM01/cam4/0002/0001.jpg",
         "SYSU-MM01/cam5/0003/0009.jpg", "SYSU-MM01/cam3/0001/0001.jpg", "SYSU-MM01/cam6/0001/0001.jpg"],
        [("SYSU-MM01/cam1/0001/0001.jpg", "0001", "cam1"), ("SYSU-MM01/cam2/0001/0002.jpg", "0001", "cam2"),
         ("SYSU-MM01/cam4/0002/0001.jpg", "0002", "cam4"), ("SYSU-MM01/cam5/0003/0009.jpg", "0003", "cam5")],
        None, ""),  # cam3 / cam6 (infrared) are not read
    "Thermalworld": (
        ["thermalworld_rgb/0001/a.jpg", "thermalworld_rgb/0001/b.jpg", "thermalworld_rgb/0002/c.jpg"],
        [("thermalworld_rgb/0001/a.jpg", "0001", "cam0"), ("thermalworld_rgb/0001/b.jpg", "0001", "cam0"),
         ("thermalworld_rgb/0002/c.jpg", "0002", "cam0")],
        None, ""),
    "PeS3D": (
        ["3DPeS/001/x.bmp", "3DPeS/002/y.bmp"],
        [("3DPeS/001/x.bmp", "001", "cam0"), ("3DPeS/002/y.bmp", "002", "cam0")],
        None, ""),
    "CAVIARa": (
        ["CAVIARa/0001001.jpg", "CAVIARa/0001002.jpg", "CAVIARa/0002001.jpg"],
        [("CAVIARa/0001001.jpg", "0001", "cam0"), ("CAVIARa/0001002.jpg", "0001", "cam0"),
         ("CAVIARa/0002001.jpg", "0002", "cam0")],
        "CAVIARa/ab.jpg", "first 4 characters"),
    "VIPeR": (
        ["VIPeR/cam_a/000_45.bmp", "VIPeR/cam_a/001_0.bmp", "VIPeR/cam_b/000_90.bmp", "VIPeR/cam_b/001_180.bmp"],
        [("VIPeR/cam_a/000_45.bmp", "000", "cam_a"), ("VIPeR/cam_a/001_0.bmp", "001", "cam_a"),
         ("VIPeR/cam_b/000_90.bmp", "000", "cam_b"), ("VIPeR/cam_b/001_180.bmp", "001", "cam_b")],
        "VIPeR/cam_b/portrait.bmp", "<pid>_<angle>.bmp"),
    "LPW": (
        ["pep_256x128/data_slim/scen1/view1/1/a.jpg", "pep_256x128/data_slim/scen1/view2/1/b.jpg",
         "pep_256x128/data_slim/scen2/view1/1/c.jpg", "pep_256x128/data_slim/scen3/view4/5/d.jpg"],
        # ids restart per scene (scene-qualified); camera folders are shared across scenes
        [("pep_256x128/data_slim/scen1/view1/1/a.jpg", "scen1-1", "view1"),
         ("pep_256x128/data_slim/scen1/view2/1/b.jpg", "scen1-1", "view2"),
         ("pep_256x128/data_slim/scen2/view1/1/c.jpg", "scen2-1", "view1"),
         ("pep_256x128/data_slim/scen3/view4/5/d.jpg", "scen3-5", "view4")],
        None, ""),
    "Shinpuhkan": (
        ["shinpuhkan/0001/0001_a_cam1_0001.jpg", "shinpuhkan/0001/0001_a_cam3_0002.jpg",
         "shinpuhkan/x/y/0002_b_cam1_0001.jpg"],
        [("shinpuhkan/0001/0001_a_cam1_0001.jpg", "0001", "cam1"), ("shinpuhkan/0001/0001_a_cam3_0002.jpg", "0001", "cam3"),
         ("shinpuhkan/x/y/0002_b_cam1_0001.jpg", "0002", "cam1")],
        "shinpuhkan/0001/0001_a.jpg", "<pid>_<x>_<camera>_"),
    "WildTrackCrop": (
        ["Wildtrack_crop_dataset/crop/0001/02_00000135.png", "Wildtrack_crop_dataset/crop/0001/05_00000140.png",
         "Wildtrack_crop_dataset/crop/0002/02_00000001.png"],
        [("Wildtrack_crop_dataset/crop/0001/02_00000135.png", "0001", "02"),
         ("Wildtrack_crop_dataset/crop/0001/05_00000140.png", "0001", "05"),
         ("Wildtrack_crop_dataset/crop/0002/02_00000001.png", "0002", "02")],
        "Wildtrack_crop_dataset/crop/0002/nounderscore.png", "<camera>_<frame>.png"),
}


def make(name, root, files=None):
    """Build the set's fake tree under ``root`` (AirportALERT also gets its filepath.txt)."""
    touch_all(root, files if files is not None else SETS[name][0])
    if name == "AirportALERT":
        write(os.path.join(root, "AirportALERT", "filepath.txt"), AIRPORT_LIST)


def test_every_fast_reid_training_set_is_registered_as_training_only():
    assert sorted(SETS) == sorted(TRAINING_ONLY_SETS)
    for name in SETS:
        assert DATASET_REGISTRY.get(name).TRAIN_ONLY


@pytest.mark.parametrize("name", sorted(SETS))
def test_ids_cameras_and_counts(tmp_path, name):
    root = str(tmp_path)
    make(name, root)
    ds = get_dataset(name, root)
    assert relative(ds.train, root) == numbered(SETS[name][1])
    assert ds.query == [] and ds.gallery == []
    assert ds.summary_rows()[0] == ["train", len({p for _, p, _ in SETS[name][1]}), len(SETS[name][1]),
                                    len({c for _, _, c in SETS[name][1]})]


@pytest.mark.parametrize("name", sorted(SETS))
def test_missing_folder_names_the_path_and_layout(tmp_path, name):
    cls = DATASET_REGISTRY.get(name)
    with pytest.raises(DatasetNotFoundError) as err:
        get_dataset(name, str(tmp_path))
    message = str(err.value)
    assert "\n" not in message
    assert f"'{cls.FOLDER}/'" in message and cls.LAYOUT in message and str(tmp_path) in message


@pytest.mark.parametrize("name", sorted(n for n in SETS if SETS[n][2]))
def test_a_name_that_breaks_the_rule_is_one_line_naming_file_and_pattern(tmp_path, name):
    root = str(tmp_path)
    _, expected, bad, rule = SETS[name]
    make(name, root)
    touch(os.path.join(root, bad))
    with pytest.raises(DatasetFormatError) as err:
        get_dataset(name, root)
    message = str(err.value)
    assert "\n" not in message and os.path.basename(bad) in message and rule in message
    # `reid-data check` mode: the good files load, the bad one is listed.
    with collect_file_problems() as problems:
        ds = get_dataset(name, root)
    assert relative(ds.train, root) == numbered(expected)
    broken = [os.path.relpath(p.path, root) for p in problems if "not read" not in p.rule]
    assert broken == [os.path.normpath(bad)]  # (other problems: image files of another type, not read)


@pytest.mark.parametrize("name,files,sample", [
    ("Thermalworld", ["thermalworld_rgb/0001/a.png", "thermalworld_rgb/0001/b.png"], "a.png"),
    ("VIPeR", ["VIPeR/cam_a/000_45.jpg", "VIPeR/cam_b/000_90.bmp"], "000_45.jpg"),
])
def test_a_folder_of_other_image_files_names_a_sample_and_the_pattern(tmp_path, name, files, sample):
    make(name, str(tmp_path), files)
    with pytest.raises(DatasetFormatError) as err:
        get_dataset(name, str(tmp_path))
    message = str(err.value)
    assert "\n" not in message and sample in message and "found none" in message


def test_stray_images_are_ignored_when_loading_and_listed_by_check(tmp_path):
    root = str(tmp_path)
    make("iLIDS", root)  # holds iLIDS/stray.png, outside any person folder
    touch(os.path.join(root, "iLIDS", "person001", "extra.jpg"))  # not a .png
    assert len(get_dataset("iLIDS", root).train) == 3
    with collect_file_problems() as problems:
        get_dataset("iLIDS", root)
    assert sorted(os.path.basename(p.path) for p in problems) == ["extra.jpg", "stray.png"]


def test_airport_list_lines_are_checked(tmp_path):
    root = str(tmp_path)
    make("AirportALERT", root)
    write(os.path.join(root, "AirportALERT", "filepath.txt"),
          AIRPORT_LIST + "garbage\ncam1\\11002\\missing.jpg\n")
    with pytest.raises(DatasetFormatError, match=r"filepath.txt:6.*<camera>\\<pid>\\<file>"):
        get_dataset("AirportALERT", root)
    with collect_file_problems() as problems:
        ds = get_dataset("AirportALERT", root)
    assert len(ds.train) == 3
    assert [os.path.basename(p.path) for p in problems] == ["filepath.txt:6", "missing.jpg"]


def test_training_only_sets_cannot_be_tested(tmp_path):
    with pytest.raises(ConfigError) as err:
        dataset_class("VIPeR", "DATASETS.TESTS")
    message = str(err.value)
    assert "\n" not in message and "DATASETS.TESTS" in message and "training images only" in message
    # The sets that can be tested are named, the training-only ones are not.
    assert "Market1501" in message and "viper" in message and "cuhkSYSU" not in message
    cfg = get_cfg()
    cfg.DATASETS.NAMES = ("VIPeR", "cuhkSYSU")  # fine for training
    cfg.DATASETS.TESTS = ("Market1501", "cuhkSYSU")
    with pytest.raises(ConfigError, match="DATASETS.TESTS: cuhkSYSU has training images only"):
        check_data_config(cfg)
    cfg.DATASETS.TESTS = ("Market1501",)
    check_data_config(cfg)


def test_training_only_sets_merge_with_their_own_ids_and_cameras(tmp_path):
    root = str(tmp_path)
    make("VIPeR", root)
    make("CAVIARa", root)
    items, num_classes, num_cams = merge_train_sets([get_dataset("VIPeR", root), get_dataset("CAVIARa", root)])
    # VIPeR: 2 people, 2 cameras; CAVIARa: 2 people (0001, 0002 are new ids), 1 camera.
    assert (len(items), num_classes, num_cams) == (7, 4, 3)


def test_torchreid_cuhksysu_keeps_the_id_text(tmp_path):
    root = str(tmp_path)
    touch_all(root, ["cuhksysu/cropped_images/p11422_s16929_1.jpg", "cuhksysu/cropped_images/p11422_s2_1.jpg",
                     "cuhksysu/cropped_images/p00007_s1_1.jpg"])
    ds = get_dataset("cuhksysu", root)
    assert relative(ds.train, root) == numbered([("cuhksysu/cropped_images/p11422_s16929_1.jpg", "p11422", "0"),
                                                 ("cuhksysu/cropped_images/p11422_s2_1.jpg", "p11422", "0"),
                                                 ("cuhksysu/cropped_images/p00007_s1_1.jpg", "p00007", "0")])
    with pytest.raises(ConfigError, match="cuhksysu has training images only"):
        dataset_class("cuhksysu", "DATASETS.TESTS")
