"""Fixtures of the gallery tests: ReID-like generated features, and a Milvus Lite server per session.

The features imitate a ReID test set: identities as unit-vector centres, each identity's
images spread around its centre, several cameras, so rankings, filters and mAP behave as
on real features (not uniform noise).
"""
import itertools
import os

import numpy as np
import pytest

from reid_engine.gallery import Location, Records
from reid_engine.gallery.embedding import feature_file_contract

# the fixtures of the inference tests (tiny checkpoint, its config file), for the command tests
from tests.inference.conftest import tiny_checkpoint, tiny_config_file, tiny_predictor  # noqa: F401

DIM = 32


def reid_like(num_ids: int, per_id: int, num_cams: int = 3, dim: int = DIM, spread: float = 0.6, seed: int = 0):
    """(features, pids, camids) of `num_ids` identities with `per_id` images each, unit rows."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_ids, dim))
    pids = np.repeat(np.arange(num_ids), per_id)
    x = centres[pids] / np.sqrt(dim) + rng.normal(size=(len(pids), dim)) * spread / np.sqrt(dim)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    camids = rng.integers(0, num_cams, size=len(pids))
    return x.astype(np.float32), pids, camids


def gallery_records(pids, camids, times=None, prefix="g"):
    """Records of generated items: paths g00000.jpg..., with times when given."""
    columns = {"path": [f"{prefix}{i:05d}.jpg" for i in range(len(pids))], "pid": pids, "camid": camids}
    if times is not None:
        columns["time"] = times
    return Records.from_columns(columns)


def contract_of(features):
    """The contract an index of generated features keeps (dimension only, as a feature file's)."""
    return feature_file_contract(features, "generated.npz").to_dict()


@pytest.fixture(scope="session")
def milvus_uri(tmp_path_factory):
    """A Milvus Lite database file (Milvus Lite runs in-process when pymilvus opens it); skip when it cannot run."""
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install milvus-lite)")
    uri = str(tmp_path_factory.mktemp("milvus") / "gallery.db")
    from reid_engine.gallery.backends import _client

    try:
        _client(Location("probe", "milvus", uri)).list_collections()
    except Exception as e:  # e.g. a platform Milvus Lite does not support
        pytest.skip(f"Milvus Lite cannot run here: {e}")
    return uri


_names = itertools.count()


@pytest.fixture(params=["faiss", "milvus"])
def location(request, tmp_path):
    """A fresh index location on each back end (the same API tests run on both)."""
    if request.param == "faiss":
        return Location(os.path.join(str(tmp_path), "gallery.rindex"))
    uri = request.getfixturevalue("milvus_uri")
    return Location(f"gallery_{next(_names)}", "milvus", uri)
