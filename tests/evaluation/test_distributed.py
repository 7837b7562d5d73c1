"""ReidEvaluator with 2 gloo workers (contiguous InferenceSampler-style shards) equals 1 worker."""
import pytest
import torch

from reid_engine.config import get_cfg
from reid_engine.engine.launch import launch
from reid_engine.evaluation import ReidEvaluator
from reid_engine.utils import comm

NUM_ITEMS, NUM_QUERY, WORLD = 42, 10, 2


def _data():
    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(5, 8, generator=gen)
    pids = torch.randint(0, 5, (NUM_ITEMS,), generator=gen)
    camids = torch.randint(0, 3, (NUM_ITEMS,), generator=gen)
    feats = centers[pids] + 0.8 * torch.randn(NUM_ITEMS, 8, generator=gen)
    return feats, pids, camids


def _evaluate(indices):
    feats, pids, camids = _data()
    cfg = get_cfg()
    cfg.TEST.ROC.ENABLED = True
    evaluator = ReidEvaluator(cfg, NUM_QUERY)
    evaluator.reset()
    for i in range(0, len(indices), 4):  # batches of 4, the last one shorter
        idx = indices[i:i + 4]
        evaluator.process({"targets": pids[idx], "camids": camids[idx]}, feats[idx])
    return evaluator.evaluate()


def _evaluate_shard(out_path):
    """Worker: evaluate this rank's contiguous shard (like InferenceSampler: 21 / 21)."""
    torch.set_num_threads(1)
    rank, shard = comm.get_rank(), NUM_ITEMS // WORLD
    results = _evaluate(torch.arange(rank * shard, (rank + 1) * shard))
    if rank == 0:
        torch.save(dict(results), out_path)
    else:
        assert results == {}


@pytest.mark.slow
def test_two_gloo_workers_equal_one(tmp_path):
    out_path = str(tmp_path / "results.pth")
    # Through launch, whose workers end without a signal. This test's own workers once aborted
    # (SIGABRT, issue 37): comm's cached object-collective group kept the process group alive past
    # dist.destroy_process_group, and a gloo thread still releasing the last collective was
    # ended by Python in interpreter finalization.
    launch(_evaluate_shard, WORLD, dist_url="auto", args=(out_path,), backend="gloo")
    distributed = torch.load(out_path)
    single = _evaluate(torch.arange(NUM_ITEMS))
    assert list(distributed) == list(single)
    assert distributed == dict(single)  # identical, not merely close
