"""VERI-Wild and its small / medium / large test sets on a fake tree."""

import os

import pytest

from reid_engine.data.datasets import DatasetFormatError, DatasetNotFoundError, collect_file_problems, get_dataset
from tests.data.datasets.fake_trees import relative, touch, write

# (vid, imgid, camera)
TRAIN = [("00001", "000001", 1), ("00001", "000002", 3), ("00002", "000003", 1)]
TEST = {  # size: (query, gallery)
    3000: ([("00010", "000101", 2)], [("00010", "000102", 5), ("00011", "000103", 2)]),
    5000: ([("00012", "000104", 7)], [("00012", "000105", 8)]),
    10000: ([("00013", "000106", 1)], [("00013", "000107", 4), ("00013", "000108", 9)]),
}


def lines(rows):
    return "".join(f"{vid}/{imgid}\n" for vid, imgid, _ in rows)


def make_veriwild(root):
    base = os.path.join(root, "VERI-Wild")
    rows = TRAIN + [r for q, g in TEST.values() for r in q + g]
    for vid, imgid, _ in rows:
        touch(os.path.join(base, "images", vid, imgid + ".jpg"))
    split = os.path.join(base, "train_test_split")
    write(os.path.join(split, "vehicle_info.txt"),
          "id/image;Camera ID;Time;Model;Type;Color\n"
          + "".join(f"{vid}/{imgid};{cam};2018-03-11 10:41:46;Audi;SUV;white\n" for vid, imgid, cam in rows))
    write(os.path.join(split, "train_list.txt"), lines(TRAIN))
    for size, (query, gallery) in TEST.items():
        write(os.path.join(split, f"test_{size}_query.txt"), lines(query))
        write(os.path.join(split, f"test_{size}.txt"), lines(gallery))
    return base


def expected(rows):
    return sorted((f"VERI-Wild/images/{vid}/{imgid}.jpg", int(vid), cam) for vid, imgid, cam in rows)


@pytest.mark.parametrize("name,size", [("VeRiWild", 10000), ("SmallVeRiWild", 3000), ("MediumVeRiWild", 5000),
                                       ("LargeVeRiWild", 10000)])
def test_lists_ids_and_cameras(tmp_path, name, size):
    root = str(tmp_path)
    make_veriwild(root)
    ds = get_dataset(name, root)
    query, gallery = TEST[size]
    # vid = the int of the first list field; camera = vehicle_info's, as written (not shifted).
    assert relative(ds.query, root) == expected(query)
    assert relative(ds.gallery, root) == expected(gallery)
    # train vids 1, 2 relabelled 0, 1; cameras kept as written
    assert relative(ds.train, root) == [("VERI-Wild/images/00001/000001.jpg", 0, 1),
                                        ("VERI-Wild/images/00001/000002.jpg", 0, 3),
                                        ("VERI-Wild/images/00002/000003.jpg", 1, 1)]
    assert ds.distractor_pids == frozenset()


def test_missing_folder_and_list_files(tmp_path):
    root = str(tmp_path)
    with pytest.raises(DatasetNotFoundError) as err:
        get_dataset("SmallVeRiWild", root)
    assert "\n" not in str(err.value) and "'VERI-Wild/'" in str(err.value) and "vehicle_info.txt" in str(err.value)
    base = make_veriwild(root)
    os.remove(os.path.join(base, "train_test_split", "test_5000_query.txt"))
    get_dataset("SmallVeRiWild", root)  # the other sizes do not need it
    with pytest.raises(DatasetNotFoundError, match="missing file .*test_5000_query.txt"):
        get_dataset("MediumVeRiWild", root)


def test_bad_lines_fail_fast_and_are_all_listed_by_check(tmp_path):
    root = str(tmp_path)
    base = make_veriwild(root)
    split = os.path.join(base, "train_test_split")
    write(os.path.join(split, "train_list.txt"), lines(TRAIN) + "not-a-line\n00003/999999\n")
    os.remove(os.path.join(base, "images", "00002", "000003.jpg"))
    with open(os.path.join(split, "vehicle_info.txt"), "a") as f:
        f.write("00004/000400;cam?;x\n")
    with pytest.raises(DatasetFormatError) as err:
        get_dataset("VeRiWild", root)
    assert "\n" not in str(err.value) and "vehicle_info.txt:" in str(err.value)
    with collect_file_problems() as problems:
        ds = get_dataset("VeRiWild", root)
    assert len(ds.train) == 2
    assert [os.path.basename(p.path) for p in problems] == [
        "vehicle_info.txt:13", "000003.jpg", "train_list.txt:4", "train_list.txt:5"]
    assert "integer camera" in problems[0].rule and "<vid>/<imgid>" in problems[2].rule
    assert "999999" in problems[3].rule
