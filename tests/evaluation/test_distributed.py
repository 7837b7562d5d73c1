"""ReidEvaluator with 2 gloo workers (contiguous InferenceSampler-style shards) equals 1 worker."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reid_engine.config import get_cfg
from reid_engine.evaluation import ReidEvaluator

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


def _worker(rank, port, out_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        shard = NUM_ITEMS // WORLD  # contiguous shards like InferenceSampler: 21 / 21
        results = _evaluate(torch.arange(rank * shard, (rank + 1) * shard))
        if rank == 0:
            torch.save(dict(results), out_path)
        else:
            assert results == {}
        # Both workers finish their gloo traffic before either tears the group down: a worker
        # that destroys it while its peer still talks can abort in gloo's threads (SIGABRT).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_gloo_workers_equal_one(tmp_path):
    out_path = str(tmp_path / "results.pth")
    mp.spawn(_worker, args=(_free_port(), out_path), nprocs=WORLD, join=True)
    distributed = torch.load(out_path)
    single = _evaluate(torch.arange(NUM_ITEMS))
    assert list(distributed) == list(single)
    assert distributed == dict(single)  # identical, not merely close
