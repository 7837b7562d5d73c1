"""The index API on both back ends: build, reopen, add, top-k, filters, re-ranking, evaluation through the index."""
import numpy as np
import pytest
import torch

from reid_engine.evaluation.rank import evaluate_rank_from_features
from reid_engine.gallery import (
    SearchFilter,
    create_index,
    evaluate_with_index,
    open_index,
    parse_where,
    query_filter,
    search_index,
)

from .conftest import contract_of, gallery_records, reid_like


@pytest.fixture(scope="module")
def data():
    features, pids, camids = reid_like(num_ids=40, per_id=8, num_cams=3)
    times = np.arange(len(pids), dtype=np.float64)
    return features, pids, camids, times


def _built(location, data, split=200):
    features, pids, camids, times = data
    records = gallery_records(pids, camids, times)
    index = create_index(location, contract_of(features), len(features))
    index.add(features[:split], records.take(np.arange(split)))
    index.save()
    index = open_index(location)
    index.add(features[split:], records.take(np.arange(split, len(features))))  # `add` without a rebuild
    index.save()
    return open_index(location)


def test_topk_matches_brute_force_with_metadata(location, data):
    features, pids, camids, times = data
    index = _built(location, data)
    assert len(index) == len(features) and index.manifest.fields == ["path", "pid", "camid", "time"]
    queries = features[[3, 100, 250]] + 0.01
    result = search_index(index, queries, k=5)
    sims = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ features.T
    for q, (ids, dist, recs) in enumerate(zip(result.ids, result.distances, result.records)):
        np.testing.assert_array_equal(ids, np.argsort(-sims[q], kind="stable")[:5])
        np.testing.assert_allclose(dist, 1.0 - sims[q, ids], atol=1e-5)
        assert list(recs.path) == [f"g{i:05d}.jpg" for i in ids]
        np.testing.assert_array_equal(recs.camid, camids[ids])
        np.testing.assert_array_equal(recs.time, times[ids])


def test_filters_exclude_camera_time_window_and_where(location, data):
    features, pids, camids, times = data
    index = _built(location, data)
    flt = query_filter(SearchFilter(tuple(parse_where(["pid >= 5"]))), query_camid=int(camids[10]),
                       exclude_same_camera=True, time_window=(20.0, 200.0))
    result = search_index(index, features[[10]], k=30, filters=[flt])
    ids = result.ids[0]
    allowed = (camids != camids[10]) & (times >= 20) & (times <= 200) & (pids >= 5)
    sims = features[10] @ features.T
    expected = [i for i in np.argsort(-sims, kind="stable") if allowed[i]][:30]
    np.testing.assert_array_equal(ids, expected)


def test_rerank_reorders_the_candidates(location, data):
    features, pids, camids, _ = data
    index = _built(location, data)
    plain = search_index(index, features[[7]], k=10, rerank_candidates=40)
    reranked = search_index(index, features[[7]], k=10, rerank=True, rerank_candidates=40)
    candidates = search_index(index, features[[7]], k=40).ids[0]
    assert set(reranked.ids[0]) <= set(candidates)
    assert np.all(np.diff(reranked.distances[0]) >= 0)
    # re-ranking favours the query's identity at least as much as the plain ranking
    assert (pids[reranked.ids[0]] == pids[7]).sum() >= (pids[plain.ids[0]] == pids[7]).sum()


def test_index_map_and_cmc_equal_the_evaluator(location, data):
    features, pids, camids, _ = data
    gallery = np.arange(len(features)) % 16 != 0  # 20 queries: Milvus Lite answers one search RPC per query
    index = create_index(location, contract_of(features), int(gallery.sum()))
    index.add(features[gallery], gallery_records(pids[gallery], camids[gallery]))
    index.save()
    q = ~gallery
    metrics = evaluate_with_index(open_index(location), features[q], pids[q], camids[q])
    cmc, mean_ap, minp = evaluate_rank_from_features(torch.from_numpy(features[q]), torch.from_numpy(features[gallery]),
                                                     pids[q], pids[gallery], camids[q], camids[gallery])
    assert abs(metrics["mAP"] - mean_ap) < 1e-6 and abs(metrics["mINP"] - minp) < 1e-6
    np.testing.assert_allclose(metrics["cmc"], cmc, atol=1e-6)
    assert 0.2 < mean_ap < 1.0  # a real ranking, not a trivial one


def test_info_names_the_plan_and_the_model(location, data):
    info = _built(location, data).info()
    assert info["backend"] == location.backend and info["count"] == len(data[0])
    assert info["plan"]["kind"] == "flat" and info["contract"]["feature_dim"] == str(data[0].shape[1])
