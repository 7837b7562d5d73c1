"""Multi-source training: domain indices in the batch, DomainBalancedSampler, the DG config
and a short training run on two sources evaluated on a held-out third (tiny JPEG trees)."""

import itertools
import logging
import math
import os
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from reid_engine.config import ConfigError, get_cfg
from reid_engine.data import build_reid_train_loader
from reid_engine.data.build import check_data_config
from reid_engine.data.samplers import SAMPLER_REGISTRY, DomainBalancedSampler, NaiveIdentitySampler
from tests.conftest import REPO_ROOT

# (training ids, images per id) of the three tiny sources; all use the id names 001, 002, ...
SOURCES = {"src_a": (6, 4), "src_b": (4, 3), "src_c": (3, 4)}


def _write_tree(root, name, ids, per_id, seed):
    """An ImageFolder tree: ``ids`` train ids x ``per_id`` images over 2 cameras, 2 test ids."""
    rng = np.random.default_rng(seed)

    def write(split, pid, cam, tag):
        path = os.path.join(root, name, split, f"{pid:03d}", f"{pid:03d}_c{cam}_{tag}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 16, 3), dtype=np.uint8)).save(path, quality=90)

    for pid in range(1, ids + 1):
        for i in range(per_id):
            write("train", pid, i % 2 + 1, i)
    for pid in range(1, 3):
        write("query", pid, 1, "q")
        write("gallery", pid, 2, "g")


@pytest.fixture(scope="module")
def sources_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("multi_source"))
    for seed, (name, (ids, per_id)) in enumerate(SOURCES.items()):
        _write_tree(root, name, ids, per_id, seed)
    return root


def _cfg(root, names=("src_a", "src_b", "src_c"), sampler="DomainBalancedSampler", batch=12, k=2):
    cfg = get_cfg()
    cfg.DATASETS.ROOT = root
    cfg.DATASETS.NAMES = tuple(f"ImageFolder:{n}" for n in names)
    cfg.INPUT.SIZE_TRAIN = [32, 16]
    cfg.INPUT.SIZE_TEST = [32, 16]
    cfg.DATALOADER.SAMPLER_TRAIN = sampler
    cfg.DATALOADER.NUM_INSTANCE = k
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.SOLVER.IMS_PER_BATCH = batch
    cfg.SEED = 7
    return cfg


def _batches(loader, n):
    return list(itertools.islice(iter(loader), n))


# ----------------------------------------------------------------- the loader's domain index


def test_batches_carry_the_domain_of_every_image(sources_root):
    loader = build_reid_train_loader(_cfg(sources_root))
    dataset = loader.dataset
    assert dataset.num_domains == 3
    assert dataset.num_classes == sum(ids for ids, _ in SOURCES.values())  # 001 of A is not 001 of B
    assert dataset.num_cameras == 6  # camera 1 of A is not camera 1 of B
    names = list(SOURCES)
    seen = Counter()
    for batch in _batches(loader, 6):
        assert batch["domains"].dtype == torch.int64 and batch["domains"].shape == (12,)
        for path, domain, target in zip(batch["img_paths"], batch["domains"].tolist(),
                                        batch["targets"].tolist()):
            assert os.sep + names[domain] + os.sep in path
            seen[domain] += 1
            # merge_train_sets numbers ids in DATASETS.NAMES order: each source its own range
            first = sum(SOURCES[n][0] for n in names[:domain])
            assert first <= target < first + SOURCES[names[domain]][0]
        # 6 ids of K = 2, two from each source
        assert Counter(batch["domains"].tolist()[::2]) == {0: 2, 1: 2, 2: 2}
    assert seen == {0: 24, 1: 24, 2: 24}


def test_other_samplers_carry_domains_too_and_resume_keeps_them(sources_root):
    cfg = _cfg(sources_root, names=("src_b", "src_a"), sampler="TrainingSampler")
    whole = _batches(build_reid_train_loader(cfg), 5)
    assert {d for b in whole for d in b["domains"].tolist()} == {0, 1}
    cfg.DATALOADER.SAMPLER_TRAIN = "DomainBalancedSampler"
    first = build_reid_train_loader(cfg)
    whole = _batches(first, 6)
    resumed = build_reid_train_loader(cfg)
    resumed.load_state_dict({**first.state_dict(), "num_batches": 2})
    for a, b in zip(_batches(resumed, 4), whole[2:]):
        assert a["img_paths"] == b["img_paths"] and torch.equal(a["domains"], b["domains"])
        assert torch.equal(a["images"], b["images"]) and torch.equal(a["targets"], b["targets"])


def test_impossible_balance_is_a_one_line_config_error(sources_root):
    # 4 images of K = 2 make 2 ids per batch: too few for 3 sources
    with pytest.raises(ConfigError, match="holds 2 ids .* fewer than the 3 training sets") as err:
        build_reid_train_loader(_cfg(sources_root, batch=4))
    assert "\n" not in str(err.value)
    # 24 images of K = 2 take 4 ids of each source; src_c has only 3
    with pytest.raises(ConfigError, match="training set 2 of DATASETS.NAMES has 3 ids but a batch "
                                          "may take 4") as err:
        build_reid_train_loader(_cfg(sources_root, batch=24))
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------- the sampler itself


def _domain_items(*domains):
    """Items and domain indices: ``domains[d]`` lists the image counts of domain d's ids."""
    items, set_ids = [], []
    for d, counts in enumerate(domains):
        for n in counts:
            pid = len({p for _, p, _ in items})
            items += [(f"{d}_{pid}_{i}.jpg", pid, 3 * d + i % 3) for i in range(n)]
            set_ids += [d] * n
    return items, set_ids


ITEMS, SET_IDS = _domain_items([6, 9, 4, 12, 5, 7, 8, 10], [4, 2, 6, 5, 3, 9], [5, 8, 4, 6, 7])


def _sampler(mini, cls=DomainBalancedSampler, items=ITEMS, set_ids=SET_IDS, **kw):
    kw = {"seed": 3, "rank": 0, "world_size": 1, "num_instances": 4, **kw}
    if cls is DomainBalancedSampler:
        kw["set_ids"] = set_ids
    return cls(items, mini, **kw)


def _take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def _groups(indices, k=4):
    """Split a stream into groups of K; check each is one id."""
    groups = [indices[i:i + k] for i in range(0, len(indices), k)]
    for g in groups:
        assert len({ITEMS[i][1] for i in g}) == 1
    return groups


def test_registered_and_read_by_the_loader_builder():
    assert SAMPLER_REGISTRY.get("DomainBalancedSampler") is DomainBalancedSampler
    assert DomainBalancedSampler.extra_args == ("num_instances", "set_ids")


def test_every_batch_splits_its_ids_evenly_over_domains():
    stream = _take(_sampler(24), 24 * 40)  # P = 6 ids of K = 4: 2 per domain
    for b in range(40):
        groups = _groups(stream[b * 24:(b + 1) * 24])
        pids = [ITEMS[g[0]][1] for g in groups]
        assert len(set(pids)) == 6
        assert [SET_IDS[g[0]] for g in groups] == [0, 0, 1, 1, 2, 2]  # in domain order
    # ids with fewer than K images (2 and 3 images) are drawn with replacement
    small = [g for g in _groups(stream) if len(set(g)) < 4]
    assert small and all({ITEMS[i][1] for i in g} <= {9, 12} for g in small)
    assert len(set(map(tuple, _groups(stream)))) > 100  # many different groups


def test_indivisible_batches_differ_by_one_id_and_even_out():
    stream = _take(_sampler(16), 16 * 600)  # P = 4 over 3 domains: 2/1/1, the 2 rotating
    totals = Counter()
    for b in range(600):
        domains = [SET_IDS[g[0]] for g in _groups(stream[b * 16:(b + 1) * 16])]
        assert sorted(Counter(domains).values()) == [1, 1, 2] and domains == sorted(domains)
        totals.update(domains)
    assert all(abs(totals[d] / 800 - 1) < 0.1 for d in range(3)), totals


def test_deterministic_under_the_seed():
    assert _take(_sampler(24), 2000) == _take(_sampler(24), 2000)
    assert _take(_sampler(24), 2000) != _take(_sampler(24, seed=4), 2000)


def test_single_domain_is_the_naive_identity_sampler():
    items, set_ids = _domain_items([6, 9, 4, 12, 5, 3, 8])
    for rank, world in ((0, 1), (1, 2)):
        naive = _take(_sampler(8, NaiveIdentitySampler, items, rank=rank, world_size=world), 800)
        for ids in (set_ids, None):
            got = _take(_sampler(8, items=items, set_ids=ids, rank=rank, world_size=world), 800)
            assert got == naive


def test_ranks_take_balanced_disjoint_shares_of_one_stream():
    ranks = [_sampler(12, rank=r, world_size=2) for r in range(2)]  # 3 ids each: 1 per domain
    assert all(np.array_equal(ranks[0].epoch_indices(e), ranks[1].epoch_indices(e)) for e in range(3))
    epochs = itertools.count()
    whole = []
    while len(whole) < 24 * 60:  # the global stream, epoch by epoch
        whole += ranks[0].epoch_indices(next(epochs)).tolist()
    parts = [_take(s, 12 * 60) for s in ranks]
    for b in range(60):
        shares = [part[b * 12:(b + 1) * 12] for part in parts]
        assert shares[0] + shares[1] == whole[b * 24:(b + 1) * 24]
        ids = [{ITEMS[i][1] for i in share} for share in shares]
        assert len(ids[0]) == len(ids[1]) == 3 and not ids[0] & ids[1]
        for share in shares:
            assert [SET_IDS[g[0]] for g in _groups(share)] == [0, 1, 2]


def test_resume_gives_the_identical_stream():
    whole = _take(_sampler(12, rank=1, world_size=2), 3000)
    epochs = [_sampler(12, rank=1, world_size=2).epoch_length(e) for e in range(3)]
    assert sum(epochs) // 2 < 3000  # the stream below crosses several epochs
    for start in (0, 12, 37, sum(epochs[:2]) // 2 + 5, 2400):
        resumed = _sampler(12, rank=1, world_size=2)
        resumed.load_state_dict({"seed": 3, "start": start})
        assert _take(resumed, 3000 - start) == whole[start:]
    assert resumed.state_dict() == {"seed": 3, "start": 2400}


def test_sampler_errors_name_the_keys():
    with pytest.raises(ConfigError, match="holds 2 ids .*fewer than the 3 training sets"):
        _sampler(8)
    # two ranks of 3 ids: one id of every domain each, so 2 distinct ids per domain suffice
    items, set_ids = _domain_items([4, 4, 4], [4, 4, 4], [4])
    _sampler(12, items=items, set_ids=set_ids)  # one rank takes one id of each domain: fine
    with pytest.raises(ConfigError, match="training set 2 of DATASETS.NAMES has 1 ids but a batch "
                                          "may take 2 .*SOLVER.IMS_PER_BATCH"):
        _sampler(12, items=items, set_ids=set_ids, rank=0, world_size=2)
    with pytest.raises(ValueError, match="spans several training sets"):
        _sampler(12, set_ids=[0] * 3 + [1] * (len(ITEMS) - 3))


# ----------------------------------------------------------------- the config and a training run


def test_dg_config_loads_and_names_known_sets():
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO_ROOT, "configs", "DG", "bagtricks_R50-ibn_M+C+MS-to-D.yml"))
    assert cfg.DATASETS.NAMES == ("Market1501", "CUHK03", "MSMT17")
    assert cfg.DATASETS.TESTS == ("DukeMTMC",)
    assert cfg.DATALOADER.SAMPLER_TRAIN == "DomainBalancedSampler"
    assert cfg.MODEL.BACKBONE.WITH_IBN
    cfg.DATASETS.ROOT = "/nonexistent"  # check_data_config reads no data
    check_data_config(cfg)
    per_share = cfg.SOLVER.IMS_PER_BATCH // cfg.DATALOADER.NUM_INSTANCE
    assert per_share >= len(cfg.DATASETS.NAMES)


@pytest.mark.slow
def test_two_source_training_run_sees_both_domains(sources_root, tmp_path):
    from reid_engine.engine.defaults import DefaultTrainer

    logging.getLogger("reid_engine").setLevel(logging.INFO)  # else DefaultTrainer sets up logging
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO_ROOT, "tests", "e2e", "configs", "tiny_R18.yml"))
    cfg.merge_from_list([
        "DATASETS.ROOT", sources_root, "DATASETS.NAMES", '("ImageFolder:src_a", "ImageFolder:src_b")',
        "DATASETS.TESTS", '("ImageFolder:src_c",)', "DATALOADER.SAMPLER_TRAIN", "DomainBalancedSampler",
        "DATALOADER.NUM_INSTANCE", 2, "SOLVER.IMS_PER_BATCH", 8, "SOLVER.MAX_EPOCH", 1,
        "SOLVER.WARMUP_ITERS", 1, "SOLVER.CHECKPOINT_PERIOD", 2, "TEST.EVAL_PERIOD", 1, "INPUT.SIZE_TRAIN", "[32, 16]",
        "INPUT.SIZE_TEST", "[32, 16]", "OUTPUT_DIR", str(tmp_path)])
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    model_forward, seen = trainer.model.forward, []

    def spy(batch):
        if trainer.model.training:  # test batches have no domains
            seen.append(batch["domains"].tolist())
        return model_forward(batch)

    trainer.model.forward = spy
    results = trainer.train()
    n_images = SOURCES["src_a"][0] * SOURCES["src_a"][1] + SOURCES["src_b"][0] * SOURCES["src_b"][1]
    assert trainer.max_iter == n_images // 8 == len(seen)
    assert all(Counter(d) == {0: 4, 1: 4} for d in seen)  # 2 ids of K = 2 from each source
    assert all(math.isfinite(v) for v in results["ImageFolder:src_c"].values())
