"""reid-index end to end: feature files (fast), and a model on an image folder with a picture (slow)."""
import json
import os
import shutil

import pytest

from reid_engine.cli import index as index_cli
from reid_engine.data.datasets import get_dataset
from reid_engine.inference import load_features, save_features

from .conftest import reid_like


def test_build_info_search_from_feature_files(tmp_path, capsys):
    features, pids, camids = reid_like(num_ids=12, per_id=5)
    items = [(f"g{i}.jpg", int(p), int(c)) for i, (p, c) in enumerate(zip(pids, camids))]
    feats = str(tmp_path / "gallery.npz")
    save_features(feats, features[5:], items[5:])
    save_features(str(tmp_path / "query.npz"), features[:5], items[:5])
    path = str(tmp_path / "g.rindex")
    assert index_cli.main(["build", "--index", path, "--features", feats]) == 0
    assert not os.path.exists(path + ".partial")  # the staging folder is gone once the index is written
    capsys.readouterr()
    assert index_cli.main(["info", "--index", path]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["count"] == len(features) - 5 and info["plan"]["kind"] == "flat"
    out = str(tmp_path / "hits.json")
    assert index_cli.main(["search", "--index", path, "--query-features", str(tmp_path / "query.npz"), "--topk", "4",
                           "--exclude-same-camera", "--output", out]) == 0
    with open(out, encoding="utf-8") as f:
        results = json.load(f)["results"]
    assert [r["query"] for r in results] == [f"g{i}.jpg" for i in range(5)]
    for q, result in enumerate(results):
        assert len(result["hits"]) == 4 and [h["rank"] for h in result["hits"]] == [1, 2, 3, 4]
        assert all(h["camid"] != camids[q] for h in result["hits"])
        assert all(h["distance"] <= n["distance"] for h, n in zip(result["hits"], result["hits"][1:]))


@pytest.mark.slow
def test_folder_of_crops_to_a_query_picture_and_evaluation(tmp_path, tiny_config_file, data_root, capsys):
    dataset = get_dataset("SyntheticReIDTiny", data_root)
    crops = tmp_path / "crops"
    crops.mkdir()
    for path, _, _ in dataset.gallery[:40]:
        shutil.copy(path, crops / os.path.basename(path))
    path = str(tmp_path / "crops.rindex")
    model = ["--config-file", tiny_config_file]
    assert index_cli.main(["build", "--index", path, "--image-dir", str(crops), "--chunk-size", "16"] + model) == 0
    query = dataset.query[0][0]
    vis, out = str(tmp_path / "vis"), str(tmp_path / "hits.json")
    assert index_cli.main(["search", "--index", path, "--query", query, "--topk", "5", "--vis-dir", vis,
                           "--output", out, "--rerank"] + model) == 0
    assert os.path.getsize(os.path.join(vis, "search_q0000.png")) > 1000
    with open(out, encoding="utf-8") as f:
        hits = json.load(f)["results"][0]["hits"]
    assert len(hits) == 5 and all(os.path.dirname(h["path"]) == str(crops) for h in hits)
    # the gallery split from two list files (build, then add), evaluated with the query split
    path = str(tmp_path / "split.rindex")
    for action, part, name in (("build", dataset.gallery[:40], "first.csv"), ("add", dataset.gallery[40:], "rest.csv")):
        (tmp_path / name).write_text("path,pid,camid\n" + "".join(f"{p},{pid},{cam}\n" for p, pid, cam in part))
        assert index_cli.main([action, "--index", path, "--list", str(tmp_path / name)] + model) == 0
    report_file = str(tmp_path / "eval.json")
    assert index_cli.main(["evaluate", "--index", path, "--output", report_file] + model) == 0
    with open(report_file, encoding="utf-8") as f:
        report = json.load(f)
    assert report["index"] == "flat"
    # the same figures from the evaluator on reid-extract's features of both splits
    from reid_engine.cli import extract
    from reid_engine.evaluation.rank import evaluate_rank_from_features

    q, g = str(tmp_path / "q.npz"), str(tmp_path / "g.npz")
    assert extract.main(["--config-file", tiny_config_file, "--split", "query", "--output", q]) == 0
    assert extract.main(["--config-file", tiny_config_file, "--split", "gallery", "--output", g]) == 0
    q, g = load_features(q), load_features(g)
    _, mean_ap, _ = evaluate_rank_from_features(q["features"], g["features"], q["pids"], g["pids"], q["camids"],
                                                g["camids"])
    assert abs(report["mAP"] - mean_ap) < 1e-6


def test_milvus_build_replaces_the_collection_and_add_appends(tmp_path, capsys, milvus_uri):
    features, pids, camids = reid_like(num_ids=8, per_id=4, seed=5)
    items = [(f"g{i}.jpg", int(p), int(c)) for i, (p, c) in enumerate(zip(pids, camids))]
    first, second = str(tmp_path / "first.npz"), str(tmp_path / "second.npz")
    save_features(first, features[:20], items[:20])
    save_features(second, features[20:], items[20:])
    where = ["--index", "cli_gallery", "--backend", "milvus", "--milvus-uri", milvus_uri]
    assert index_cli.main(["build", "--features", first] + where) == 0
    assert index_cli.main(["build", "--features", first] + where) == 0  # a rebuild renames over the old one
    assert index_cli.main(["add", "--features", second] + where) == 0
    capsys.readouterr()
    assert index_cli.main(["info"] + where) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["backend"] == "milvus" and info["count"] == len(features)
    out = str(tmp_path / "hits.json")
    assert index_cli.main(["search", "--query-features", second, "--topk", "1", "--output", out] + where) == 0
    with open(out, encoding="utf-8") as f:
        hits = [r["hits"][0]["path"] for r in json.load(f)["results"]]
    assert hits == [f"g{i}.jpg" for i in range(20, len(features))]  # each query finds itself
