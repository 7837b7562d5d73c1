"""reid-extract (tools/extract_features.py): file contents and order, 1 and 2 workers, folders, both formats."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from reid_engine.cli import extract
from reid_engine.data import build_transforms, read_image
from reid_engine.data.datasets import get_dataset
from reid_engine.inference import feature_paths, load_features
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def query_items(data_root):
    return get_dataset("SyntheticReIDTiny", data_root).query


@pytest.fixture(scope="module")
def one_worker_file(tiny_config_file, tmp_path_factory):
    """The query split extracted in this process (one worker), as .npz."""
    out = str(tmp_path_factory.mktemp("extract1") / "query.npz")
    assert extract.main(["--config-file", tiny_config_file, "--split", "query", "--output", out]) == 0
    return out


@pytest.mark.slow
def test_npz_contents_follow_the_split_order(one_worker_file, query_items, tiny_predictor):
    with np.load(one_worker_file, allow_pickle=False) as data:
        assert sorted(data.files) == ["camids", "features", "paths", "pids", "source"]
        features, paths = data["features"], data["paths"].tolist()
        assert features.dtype == np.float32 and features.shape == (len(query_items), 512)
        assert paths == [p for p, _, _ in query_items]
        assert data["pids"].tolist() == [pid for _, pid, _ in query_items]
        assert data["camids"].tolist() == [cam for _, _, cam in query_items]
        assert str(data["source"]) == "SyntheticReIDTiny/query"
    np.testing.assert_allclose(np.linalg.norm(features, axis=1), 1.0, atol=1e-5)
    # Row 7 is the embedding of item 7, decoded as the evaluation loader decodes it.
    pipeline = build_transforms(tiny_predictor.cfg, is_train=False)
    image = pipeline(read_image(query_items[7][0], pipeline.decode_size))
    expected = tiny_predictor.embed_batch(image[None])[0].numpy()
    np.testing.assert_allclose(features[7], expected, atol=1e-5)


@pytest.mark.slow
def test_two_workers_write_the_same_file(one_worker_file, tiny_config_file, tmp_path):
    out = str(tmp_path / "query_2w.npz")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
    cmd = [sys.executable, os.path.join(REPO_ROOT, "tools", "extract_features.py"), "--config-file",
           tiny_config_file, "--split", "query", "--output", out, "--num-gpus", "2", "--dist-url", "auto"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(worker 0 of 2)" in proc.stdout + proc.stderr  # progress lines name the shard
    assert "images/s, ETA" in proc.stdout + proc.stderr
    one, two = load_features(one_worker_file), load_features(out)
    assert two["paths"] == one["paths"]
    np.testing.assert_array_equal(two["pids"], one["pids"])
    np.testing.assert_array_equal(two["camids"], one["camids"])
    np.testing.assert_allclose(two["features"], one["features"], atol=1e-5, rtol=0)


def test_image_folder_to_npy_and_index(tiny_config_file, one_worker_file, query_items, tmp_path):
    folder = tmp_path / "photos"
    # Nested folders and names chosen so that a plain listing would not be sorted.
    layout = {"b/z.jpg": 0, "a.jpg": 1, "b/a/c.jpg": 2, "c.JPG": 3}
    for rel, i in layout.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(query_items[i][0], folder / rel)
    (folder / "notes.txt").write_text("not an image")
    out = str(tmp_path / "feats" / "photos")
    assert extract.main(["--config-file", tiny_config_file, "--image-dir", str(folder),
                         "--output", out, "--format", "npy"]) == 0
    npy, index_file = feature_paths(out, "npy")
    assert os.path.isfile(npy) and os.path.isfile(index_file)
    with open(index_file, encoding="utf-8") as f:
        index = json.load(f)
    expected_order = ["a.jpg", "b/a/c.jpg", "b/z.jpg", "c.JPG"]
    assert [os.path.relpath(p, folder).replace(os.sep, "/") for p in index["paths"]] == expected_order
    assert index["pids"] == [-1] * 4 and index["camids"] == [-1] * 4
    assert index["num_images"] == 4 and index["feature_dim"] == 512
    features = np.load(npy)
    # The same image gives the same feature as in the query-split file.
    query = load_features(one_worker_file)["features"]
    for row, rel in enumerate(expected_order):
        np.testing.assert_allclose(features[row], query[layout[rel]], atol=1e-5)
    assert torch.equal(torch.from_numpy(load_features(npy)["features"]), torch.from_numpy(features))


def test_clear_errors(tiny_config_file, tmp_path, capsys):
    base = ["--config-file", tiny_config_file, "--output", str(tmp_path / "x.npz")]
    assert extract.main(base) == 2  # a usage error
    assert "pass exactly one of --split" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert extract.main(base + ["--image-dir", str(empty)]) == 1  # a run failure: no data
    err = capsys.readouterr().err.strip()
    assert err.startswith("reid-extract: error: no image") and str(empty) in err and "\n" not in err
