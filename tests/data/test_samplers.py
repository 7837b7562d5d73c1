"""Tests of reid_engine.data.samplers: stream structure, ranks, resumption and sharding."""

import itertools
from collections import Counter

import numpy as np
import pytest

from reid_engine.config import ConfigError, get_cfg
from reid_engine.data.samplers import (
    SAMPLER_REGISTRY,
    BalancedIdentitySampler,
    DomainBalancedSampler,
    ImbalancedDatasetSampler,
    InferenceSampler,
    NaiveIdentitySampler,
    SetReWeightSampler,
    TrainingSampler,
    apportion,
)
from reid_engine.data.train_sampling import (
    StreamBatchSampler,
    build_train_sampler,
    check_stream_resume,
    per_worker_batch,
    worker_counts,
)


def _items(images_per_id, cams_per_id=3):
    """Items with ``images_per_id[p]`` images of id p, cameras cycling over ``cams_per_id``."""
    return [(f"{pid}_{i}.jpg", pid, i % cams_per_id)
            for pid, n in enumerate(images_per_id) for i in range(n)]


def _take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def _make(cls, items, mini, **kw):
    kw.setdefault("seed", 3)
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    if "num_instances" in cls.extra_args:
        kw.setdefault("num_instances", 4)
    return cls(items, mini, **kw)


def test_registry_holds_the_training_samplers():
    for name in ("TrainingSampler", "NaiveIdentitySampler", "BalancedIdentitySampler",
                 "SetReWeightSampler", "ImbalancedDatasetSampler"):
        assert name in SAMPLER_REGISTRY


def test_training_sampler_is_an_endless_seeded_shuffle():
    items = _items([5] * 6)
    stream = _take(_make(TrainingSampler, items, 4), 3 * 30)
    for epoch in range(3):
        assert sorted(stream[epoch * 30:(epoch + 1) * 30]) == list(range(30))
    assert stream[:30] != list(range(30)) and stream[:30] != stream[30:60]
    assert stream == _take(_make(TrainingSampler, items, 4), 90)
    assert stream != _take(_make(TrainingSampler, items, 4, seed=4), 90)


@pytest.mark.parametrize("cls", [NaiveIdentitySampler, BalancedIdentitySampler])
def test_identity_batches_are_p_ids_times_k(cls):
    items = _items([6, 9, 4, 12, 5, 7, 8, 10])
    stream = _take(_make(cls, items, 8), 8 * 20)
    for b in range(20):
        batch = stream[b * 8:(b + 1) * 8]
        groups = [batch[:4], batch[4:]]
        pids = [{items[i][1] for i in g} for g in groups]
        assert all(len(p) == 1 for p in pids) and pids[0] != pids[1]  # 2 ids x 4 images
        assert all(len(set(g)) == 4 for g in groups)  # every id here has >= 4 images


def test_naive_draws_small_ids_with_replacement():
    items = _items([2, 8, 8, 8])  # id 0 has only 2 images for K = 4
    stream = _take(_make(NaiveIdentitySampler, items, 8), 8 * 30)
    groups = [stream[i:i + 4] for i in range(0, len(stream), 4)]
    small = [g for g in groups if items[g[0]][1] == 0]
    assert small and all(len(g) == 4 and set(g) == {0, 1} for g in small)
    # Within one epoch the ids with >= K images are drawn without replacement.
    epoch = _make(NaiveIdentitySampler, items, 8).epoch_indices(0).tolist()
    large = [i for i in epoch if i >= 2]
    assert len(large) == len(set(large)) and len(epoch) % 8 == 0


def test_balanced_spreads_a_group_over_cameras():
    items = [(f"a{i}", 0, i) for i in range(4)] + [(f"b{i}", 1, i % 2) for i in range(8)] + \
            [(f"c{i}", 2, 0) for i in range(4)]
    stream = _take(_make(BalancedIdentitySampler, items, 8), 8 * 10)
    for g in range(0, len(stream), 4):
        group = stream[g:g + 4]
        pid, cams = items[group[0]][1], Counter(items[i][2] for i in group)
        expected = {0: [1, 1, 1, 1], 1: [2, 2], 2: [4]}[pid]  # 4 cams / 2 cams / 1 cam
        assert sorted(cams.values()) == expected


def test_set_reweight_splits_ids_by_set_weight():
    items = _items([4] * 10)
    set_ids = [0] * 20 + [1] * 20  # ids 0-4 in set 0, ids 5-9 in set 1
    for weight, expected in (([1, 1], (2, 2)), ([3, 1], (3, 1))):
        sampler = _make(SetReWeightSampler, items, 16, set_ids=set_ids, set_weight=weight)
        stream = _take(sampler, 16 * 12)
        for b in range(12):
            pids = [items[i][1] for i in stream[b * 16:(b + 1) * 16:4]]
            assert len(set(pids)) == 4
            assert (sum(p < 5 for p in pids), sum(p >= 5 for p in pids)) == expected
    with pytest.raises(ValueError, match="SET_WEIGHT"):
        _make(SetReWeightSampler, items, 16, set_ids=set_ids, set_weight=[1, 1, 1])
    assert apportion(4, [3, 1]) == [3, 1] and apportion(5, [1, 1, 1]) == [2, 2, 1]


def test_imbalanced_sampler_evens_out_identities():
    items = _items([90, 10])
    stream = _take(_make(ImbalancedDatasetSampler, items, 10), 6000)
    share = sum(items[i][1] == 1 for i in stream) / len(stream)
    assert abs(share - 0.5) < 0.04  # uniform sampling would give 0.1


def test_inference_shards_are_contiguous():
    shards = [list(InferenceSampler(42, rank=r, world_size=4)) for r in range(4)]
    assert [len(s) for s in shards] == [11, 11, 10, 10]
    assert sum(shards, []) == list(range(42))
    assert list(InferenceSampler(3, rank=3, world_size=4)) == []


@pytest.mark.parametrize("cls", [TrainingSampler, NaiveIdentitySampler, BalancedIdentitySampler,
                                 ImbalancedDatasetSampler])
def test_ranks_take_disjoint_slices_of_one_global_stream(cls):
    items = _items([5, 7, 4, 9, 6, 8, 4, 5])
    whole = _take(_make(cls, items, 8), 8 * 12)
    parts = [_take(_make(cls, items, 4, rank=r, world_size=2), 4 * 12) for r in range(2)]
    for b in range(12):
        assert parts[0][b * 4:(b + 1) * 4] + parts[1][b * 4:(b + 1) * 4] == whole[b * 8:(b + 1) * 8]
        if cls in (NaiveIdentitySampler, BalancedIdentitySampler):
            ids = [{items[i][1] for i in part[b * 4:(b + 1) * 4]} for part in parts]
            assert len(ids[0]) == len(ids[1]) == 1 and ids[0] != ids[1]  # whole groups, no overlap


@pytest.mark.parametrize("cls", [TrainingSampler, NaiveIdentitySampler, BalancedIdentitySampler,
                                 ImbalancedDatasetSampler, SetReWeightSampler])
def test_start_resumes_the_exact_stream(cls):
    items = _items([5, 7, 4, 9, 6, 8])
    extra = {"set_ids": [0] * 16 + [1] * 23} if cls is SetReWeightSampler else {}
    whole = _take(_make(cls, items, 4, rank=1, world_size=2, **extra), 400)
    for start in (0, 4, 37, 133, 250):  # several epochs in, and mid-batch
        resumed = _make(cls, items, 4, rank=1, world_size=2, **extra)
        resumed.load_state_dict({"seed": 3, "start": start})
        assert _take(resumed, 400 - start) == whole[start:]
    assert resumed.state_dict() == {"seed": 3, "start": 250}


def test_sampler_errors_are_clear():
    with pytest.raises(ValueError, match="empty"):
        _make(TrainingSampler, [], 4)
    with pytest.raises(ValueError, match="multiple of the images per id"):
        _make(NaiveIdentitySampler, _items([4] * 8), 6)
    with pytest.raises(ValueError, match="needs 4 identities"):
        _make(NaiveIdentitySampler, _items([4] * 3), 16)
    with pytest.raises(ValueError, match="rank 2"):
        _make(TrainingSampler, _items([4]), 2, rank=2, world_size=2)


def test_epoch_stream_does_not_depend_on_numpy_global_state():
    items = _items([5] * 8)
    np.random.seed(0)
    a = _take(_make(NaiveIdentitySampler, items, 8), 64)
    np.random.seed(1)
    assert _take(_make(NaiveIdentitySampler, items, 8), 64) == a


@pytest.mark.parametrize("cls", [TrainingSampler, NaiveIdentitySampler, SetReWeightSampler])
def test_resume_on_another_world_size_continues_the_global_stream_and_its_keys(cls):
    """A checkpoint of 2 workers (8 each) continues exactly on 1 and on 4 workers: neither the global
    stream nor any sample's key (which seeds its augmentation) depends on how the batch is split."""
    items = _items([5, 7, 4, 9, 6, 8])
    extra = {"set_ids": [0] * 16 + [1] * 23} if cls is SetReWeightSampler else {}

    def tagged(world, batches, start=0):  # the global stream of (index, key), rank slices interleaved
        parts = []
        for rank in range(world):
            sampler = _make(cls, items, 16 // world, rank=rank, world_size=world, **extra)
            sampler.set_start(start * 16 // world)
            parts.append(list(itertools.islice(iter(StreamBatchSampler(sampler, 16 // world)), batches)))
        return [sample for step in zip(*parts) for batch in step for sample in batch]

    whole = tagged(2, 12)
    assert len({key for _, key in whole}) == len(whole)  # distinct keys: samples augment independently
    saved = {"seed": 3, "num_batches": 5, "batch_size": 8, "world_size": 2}
    for world in (1, 4):
        check_stream_resume(saved, _make(cls, items, 16 // world, rank=0, world_size=world, **extra), 16 // world)
        assert tagged(world, 7, start=5) == whole[5 * 16:]
        assert tagged(world, 5) == whole[:5 * 16]


def test_a_stream_that_cannot_continue_on_another_world_size_is_one_clear_line():
    items = _items([5, 7, 4, 9, 6, 8, 5, 6])
    saved = {"seed": 3, "num_batches": 5, "batch_size": 8, "world_size": 2}
    with pytest.raises(ConfigError, match=r"^--resume: the checkpoint's global batch is 16 images \(8 per worker x 2 "
                                          r"workers\) but this run's is 32 \(8 x 4\).*SOLVER.IMS_PER_BATCH 16 "
                                          r"\(and SOLVER.REFERENCE_WORLD_SIZE 0"):
        check_stream_resume(saved, _make(NaiveIdentitySampler, items, 8, world_size=4), 8)
    with pytest.raises(ConfigError, match="used 8 images per worker but this run uses 16"):  # no world size saved
        check_stream_resume({"seed": 3, "num_batches": 5, "batch_size": 8}, _make(TrainingSampler, items, 16), 16)
    two_sets = {"set_ids": [0] * 16 + [1] * 34, "num_instances": 4}
    domain = _make(DomainBalancedSampler, items, 16, **two_sets)
    assert "balances each worker's share over the 2 training sets" in domain.world_size_dependence()
    with pytest.raises(ConfigError, match="trained on 2 workers, this run has 1: DomainBalancedSampler.*resume on 2 "
                                          "workers, or start a new run from its weights"):
        check_stream_resume(saved, domain, 16)
    check_stream_resume({**saved, "world_size": 1, "batch_size": 16}, domain, 16)  # the same split: fine
    assert _make(DomainBalancedSampler, items, 16, set_ids=[0] * 50).world_size_dependence() == ""
    assert worker_counts(16, 4) == [1, 2, 4] and worker_counts(12) == [1, 2, 3, 4, 6, 12]
    with pytest.raises(ConfigError, match=r"IMS_PER_BATCH \(16\) must be a positive multiple of the number of "
                                          r"workers \(3\): run on a number of workers that divides it \(1, 2, 4, 8 or 16\)"):
        per_worker_batch(16, 3, "SOLVER.IMS_PER_BATCH")
    cfg = get_cfg()
    cfg.DATALOADER.SAMPLER_TRAIN = "NaiveIdentitySampler"
    cfg.SOLVER.IMS_PER_BATCH, cfg.DATALOADER.NUM_INSTANCE = 16, 4
    with pytest.raises(ConfigError, match="gives 2 images per worker, .* run on 1, 2 or 4 workers or change one"):
        build_train_sampler(cfg, items, np.zeros(len(items), dtype=np.int64), 2, 0)  # 8 workers
