"""reid-data check (tools/data.py): the statistics table, the listed problems and the exit status."""
import os
import subprocess
import sys

from reid_engine.cli import data
from tests.conftest import REPO_ROOT
from tests.data.datasets.fake_trees import make_market, make_viper_images, touch


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
