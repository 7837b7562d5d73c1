"""Bad input to reid-index: one error line each, the right exit code, and the existing index untouched."""
import json
import os

import numpy as np
import pytest

from reid_engine.cli import index as index_cli
from reid_engine.gallery import (
    BackendUnreachableError,
    Embedder,
    IndexFileError,
    Location,
    ModelMismatchError,
    QueryInputError,
    open_index,
)
from reid_engine.inference import save_features
from reid_engine.inference.contract import DeployContract

from .conftest import reid_like


@pytest.fixture()
def built(tmp_path):
    """An index built from a feature file by the command, and its bytes."""
    features, pids, camids = reid_like(num_ids=10, per_id=4)
    feats = str(tmp_path / "gallery.npz")
    save_features(feats, features, [(f"g{i}.jpg", int(p), int(c)) for i, (p, c) in enumerate(zip(pids, camids))])
    path = str(tmp_path / "g.rindex")
    assert index_cli.main(["build", "--index", path, "--features", feats]) == 0
    with open(path, "rb") as f:
        return path, f.read(), features


def _one_error_line(capsys, code, expected_code, *words):
    err = capsys.readouterr().err.strip()
    assert code == expected_code, err
    assert err.startswith("reid-index: error: ") and "\n" not in err and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def _unchanged(path, content):
    with open(path, "rb") as f:
        assert f.read() == content


def test_missing_and_corrupt_index_files(tmp_path, capsys, built):
    path, content, _ = built
    missing = str(tmp_path / "nope.rindex")
    _one_error_line(capsys, index_cli.main(["info", "--index", missing]), 1, missing, "does not exist")
    corrupt = str(tmp_path / "corrupt.rindex")
    with open(corrupt, "wb") as f:
        f.write(content[: len(content) // 2])  # a truncated copy
    _one_error_line(capsys, index_cli.main(["info", "--index", corrupt]), 1, corrupt, "not a readable reid-index")
    with pytest.raises(IndexFileError):
        open_index(Location(corrupt))
    _unchanged(path, content)


def test_feature_file_of_another_dimension_and_filter_on_a_missing_field(tmp_path, capsys, built):
    path, content, features = built
    other = str(tmp_path / "q16.npz")
    save_features(other, np.ones((2, 16), np.float32), [("q0.jpg", 1, 0), ("q1.jpg", 2, 1)])
    err = _one_error_line(capsys, index_cli.main(["search", "--index", path, "--query-features", other]), 1,
                          "16-d", f"{features.shape[1]}-d")
    assert other in err
    good = str(tmp_path / "q.npz")
    save_features(good, features[:2], [("q0.jpg", 1, 0), ("q1.jpg", 2, 1)])
    _one_error_line(capsys, index_cli.main(["search", "--index", path, "--query-features", good, "--where",
                                            "trackid == 3"]), 2, "'trackid'", "lacks", "camid")
    _one_error_line(capsys, index_cli.main(["search", "--index", path, "--query-features", good,
                                            "--time-window", "0", "10"]), 2, "'time'")
    _one_error_line(capsys, index_cli.main(["search", "--index", path, "--query-features", good, "--where",
                                            "camid = 3"]), 2, "FIELD OP NUMBER")
    _unchanged(path, content)


def test_unreachable_milvus_uri(capsys):
    uri = "http://127.0.0.1:1"
    with pytest.raises(BackendUnreachableError):
        open_index(Location("g", "milvus", uri))
    _one_error_line(capsys, index_cli.main(["info", "--index", "g", "--backend", "milvus", "--milvus-uri", uri]), 1,
                    uri, "no Milvus server")


def test_model_mismatch_and_unreadable_query_image(tmp_path, capsys, built, tiny_predictor, data_root):
    path, content, _ = built
    embedder = Embedder(tiny_predictor.cfg, predictor=tiny_predictor)
    index = open_index(Location(path))
    with pytest.raises(ModelMismatchError) as err:
        index.check_query(embedder.contract, int(embedder.contract.feature_dim), "the query model")
    message = str(err.value)
    assert "\n" not in message and "feature file" in message and embedder.contract.meta_architecture in message
    other_checkpoint = embedder.contract.replace(source_checkpoint_sha256="0" * 64)
    with pytest.raises(ModelMismatchError, match="source_checkpoint_sha256"):
        index_of_model = type(index)(path, index.manifest)
        index_of_model.manifest.contract = embedder.contract.to_dict()
        index_of_model.check_query(other_checkpoint, int(other_checkpoint.feature_dim), "the query model")
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(QueryInputError, match="broken.jpg cannot be read"):
        embedder.embed_images([str(broken)])
    with pytest.raises(QueryInputError, match="does not exist"):
        embedder.embed_images([str(tmp_path / "absent.jpg")])
    _unchanged(path, content)
    assert isinstance(DeployContract.from_json(json.dumps(embedder.contract.to_dict())), DeployContract)
    assert os.path.isfile(path)
