"""reid-data check (tools/data.py): the statistics table, the listed problems and the exit status."""
import os
import subprocess
import sys

from reid_engine.cli import data
from tests.conftest import REPO_ROOT
from tests.data.datasets.fake_trees import image_bytes, make_market, make_viper_images, touch, write, write_image
from tests.data.test_datasets import make_msmt, make_vehicleid


def table_rows(out):
    """{subset: [cells]} of the pipe table in the report."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] in ("train", "query", "gallery"):
            rows[cells[0]] = cells[1:]
    return rows


def test_clean_market_tree_statistics_and_exit_0(tmp_path, capsys):
    make_market(str(tmp_path))
    assert data.main(["check", "Market1501", "--data-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "# junk (dropped)" in out and "# distractors" in out and "every file fits the layout" in out
    # ids, images, cameras, junk dropped, distractors (query / gallery images of pid 0)
    assert table_rows(out) == {"train": ["2", "3", "3", "1", "-"], "query": ["2", "2", "2", "0", "0"],
                               "gallery": ["3", "4", "4", "2", "2"]}


def test_bad_files_are_all_listed_with_their_rule_and_exit_1(tmp_path, capsys):
    base = make_market(str(tmp_path))
    bad = [touch(os.path.join(base, "query", "holiday.jpg")),
           touch(os.path.join(base, "bounding_box_test", "0005_c0s1_000001_00.jpg")),
           touch(os.path.join(base, "bounding_box_train", "IMG_0001.png"))]
    assert data.main(["check", "Market1501", "--data-root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "3 file(s) do not fit the layout:" in out
    for path in bad:
        assert f"  {path}: expected " in out
    assert "(<pid>_c<camera>...)" in out and "cameras counted from c1" in out
    assert table_rows(out)["query"][:2] == ["2", "2"]  # the statistics of what could be read


def test_training_only_set_split_id_and_config_root(tmp_path, capsys):
    root = str(tmp_path)
    make_viper_images(os.path.join(root, "VIPeR"), 3)
    touch(os.path.join(root, "VIPeR", "cam_a", "notes.png"))
    # The data root from the config overrides, as in training; options after the name.
    assert data.main(["check", "VIPeR", "DATASETS.ROOT", root]) == 1
    out = capsys.readouterr().out
    assert table_rows(out) == {"train": ["3", "6", "2", "-", "-"]}
    assert "notes.png: expected *.bmp files here (this one is not read)" in out
    make_viper_images(os.path.join(root, "viper", "VIPeR"), 6)
    assert data.main(["check", "viper", "--data-root", root, "DATASETS.SPLIT_ID", "3"]) == 0
    assert table_rows(capsys.readouterr().out)["query"] == ["3", "3", "1", "-", "-"]  # split 3: cam_b queries
    assert data.main(["check", "viper", "--data-root", root, "DATASETS.SPLIT_ID", "20"]) == 2
    assert "DATASETS.SPLIT_ID 20 is out of range for viper" in capsys.readouterr().err


def test_missing_dataset_and_unknown_name(tmp_path, capsys):
    assert data.main(["check", "DukeMTMC", "--data-root", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    err_lines = captured.err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("reid-data: error: DukeMTMC not found under the data root")
    assert "'DukeMTMC-reID/'" in err_lines[0]
    assert data.main(["check", "Market", "--data-root", str(tmp_path)]) == 2
    assert "did you mean Market1501" in capsys.readouterr().err


def test_tools_wrapper_exit_status(tmp_path):
    base = make_market(str(tmp_path))
    touch(os.path.join(base, "query", "holiday.jpg"))
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tools", "data.py"), "check", "Market1501",
                           "--data-root", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "holiday.jpg: expected a name like" in proc.stdout and table_rows(proc.stdout)["gallery"][0] == "3"


def test_video_sets_count_tracklets():
    from reid_engine.data.datasets import mars
    from reid_engine.data.datasets.check import STATISTICS_HEADERS, statistics_headers

    assert "# tracklets" in statistics_headers(mars) and "# images" not in statistics_headers(mars)
    assert statistics_headers(object()) == STATISTICS_HEADERS


# ------------------------------------------------------------ files left out, decoding, list lines

def test_left_out_files_are_counted_and_the_first_few_named(tmp_path, capsys):
    base = make_market(str(tmp_path))
    query = os.path.join(base, "query")
    left_out = [touch(os.path.join(query, name)) for name in
                ("._0003_c1s1_000001_00.jpg", ".DS_Store", "Thumbs.db", "readme.txt")]
    left_out.append(os.path.join(base, "bounding_box_test", "__MACOSX"))
    touch(os.path.join(left_out[-1], "._0003_c2s1_000201_01.jpg"))
    left_out.append(touch(os.path.join(base, "bounding_box_train", "notes.md")))
    assert data.main(["check", "Market1501", "--data-root", str(tmp_path)]) == 0  # left out is not a problem
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "left out" in line)
    assert line.startswith("6 file(s) left out (hidden, system or not images): ") and line.endswith(" and 1 more")
    assert sum(path in line for path in left_out) == 5
    assert "every file fits the layout" in out


def test_images_that_do_not_decode_are_reported_unless_no_decode(tmp_path, capsys):
    base = make_market(str(tmp_path))
    empty = touch(os.path.join(base, "query", "0003_c1s1_000001_00.jpg"))  # an empty file
    truncated = os.path.join(base, "bounding_box_test", "0003_c2s1_000201_01.jpg")
    with open(truncated, "wb") as f:
        f.write(image_bytes(".jpg")[:200])
    assert data.main(["check", "Market1501", "--data-root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "opened and decoded 9 image(s)" in out and "2 file(s) do not fit the layout:" in out
    assert f"  {empty}: expected an image that decodes (UnidentifiedImageError: " in out
    assert f"  {truncated}: expected an image that decodes (OSError: " in out
    assert data.main(["check", "Market1501", "--data-root", str(tmp_path), "--no-decode"]) == 0
    out = capsys.readouterr().out
    assert "decoded" not in out and "every file fits the layout" in out


def test_every_frame_of_a_video_set_is_decoded(tmp_path, capsys):
    from tests.data.datasets.test_video_datasets import _dukevid_tree

    _dukevid_tree(str(tmp_path))  # empty frame files: 12 frames, none decodes
    assert data.main(["check", "dukemtmcvidreid", "--data-root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "opened and decoded 12 image(s)" in out and "12 file(s) do not fit the layout:" in out
    assert out.count("0002C5F0009X00007.jpg: expected an image that decodes") == 1


def test_decode_progress_lines_have_an_eta(tmp_path, capsys):
    from reid_engine.data.datasets.check import find_undecodable_images

    paths = [write_image(os.path.join(str(tmp_path), f"{i}.png")) for i in range(3)]
    calls = []
    assert find_undecodable_images(paths, lambda *a: calls.append(a), every_seconds=0) == []
    assert [(done, total) for done, total, _ in calls] == [(1, 3), (2, 3), (3, 3)]
    data._print_progress(1, 4, 2.0)  # 2 s for one image: 6 s to go
    assert capsys.readouterr().err == "reid-data: decoded 1/4 images (25%), 2 s, ETA 6 s\n"


def _problem_paths(out):
    return [line.split(": expected ")[0].strip() for line in out.splitlines() if ": expected " in line]


def _check_with_added_lines(root, name, added, capsys):
    """Append ``{list file: text}`` and run ``check name --no-decode``: (exit status, report)."""
    for path, text in added.items():
        with open(path, "a") as f:
            f.write(text)
    status = data.main(["check", name, "--data-root", root, "--no-decode"])
    return status, capsys.readouterr().out


def test_every_bad_line_of_the_msmt17_lists(tmp_path, capsys):
    base = make_msmt(str(tmp_path))
    train, gallery = os.path.join(base, "list_train.txt"), os.path.join(base, "list_gallery.txt")
    status, out = _check_with_added_lines(str(tmp_path), "MSMT17", {
        train: "0000/0000_000_01_0303morning_0099_0.jpg\n0000/x.jpg zero\n0000/0000_000_01_0303morning_0015_0.jpg 0 9\n",
        gallery: "0009/0009_000_02_0303night_0003_0.jpg 9\n0000/nocamera.jpg 0\n"}, capsys)
    assert status == 1
    assert sorted(_problem_paths(out)) == sorted([
        f"{train}:4", f"{train}:5", f"{train}:6",
        os.path.join(base, "test", "0009", "0009_000_02_0303night_0003_0.jpg"), os.path.join(base, "test", "0000/nocamera.jpg")])
    assert "a line 'relative/path.jpg pid', not '0000/x.jpg zero'" in out
    assert f"an image listed in {gallery} (it does not exist)" in out
    assert table_rows(out)["train"][1] == "3"  # the good lines are still read


def test_every_bad_line_of_the_vehicleid_lists(tmp_path, capsys):
    base = make_vehicleid(str(tmp_path))
    split = os.path.join(base, "train_test_split")
    train = os.path.join(split, "train_list.txt")
    status, out = _check_with_added_lines(str(tmp_path), "SmallVehicleID", {
        train: "0000009\n0000001 one\n0000777 7\n", os.path.join(split, "test_list_800.txt"): "0000101 10 extra\n"}, capsys)
    assert status == 1
    assert sorted(_problem_paths(out)) == sorted([f"{train}:5", f"{train}:6", os.path.join(base, "image", "0000777.jpg"),
                                                  os.path.join(split, "test_list_800.txt") + ":7"])


def test_every_bad_row_of_own_csv_lists(tmp_path, capsys):
    base = os.path.join(str(tmp_path), "shop")
    for name in ("a_c1.jpg", "b_c2.jpg", "c_c1.jpg"):
        write_image(os.path.join(base, "images", name))
    rows = {"train": "path,id,camera\nimages/a_c1.jpg,1,1\nimages/a_c1.jpg,1\nimages/missing.jpg,2,1\n,3,1\n",
            "query": "images/b_c2.jpg,5,2\n", "gallery": "images/c_c1.jpg,5,1\nimages/b_c2.jpg\n"}
    for split, text in rows.items():
        write(os.path.join(base, f"{split}.csv"), text)
    assert data.main(["check", "ImageFolder:shop", "--data-root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    train = os.path.join(base, "train.csv")
    assert sorted(_problem_paths(out)) == sorted([f"{train}:3", f"{train}:5", os.path.join(base, "images", "missing.jpg"),
                                                  os.path.join(base, "gallery.csv") + ":2"])
