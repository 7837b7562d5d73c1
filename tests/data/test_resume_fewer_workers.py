"""The README's promise for a resume on fewer workers, at the loader level with the main job's config: a
2-worker run stopped after some steps and resumed on 1 worker trains, step by step, on exactly the global
batches (image indices in order, augmented pixel for pixel) of the uninterrupted 2-worker run. The
real-process version (gloo, SIGTERM, torchrun) is tests/faults/test_resume_world_size.py."""
import itertools
import os

import pytest
import torch

from reid_engine.config import get_cfg
from reid_engine.data import build_reid_train_loader
from reid_engine.utils import comm
from tests.conftest import REPO_ROOT

MAIN_JOB = os.path.join(REPO_ROOT, "configs", "SyntheticReID", "bagtricks_R18-half-ibn.yml")
STEPS = 14  # 3 epochs of the tiny set's 4 or 5 batches of 32: the stop and the epoch ends fall apart


def _loader(data_root, rank, world, monkeypatch):
    """The main job's training loader (at 64x32, global batch 32, on the tiny set) of worker `rank` of `world`."""
    monkeypatch.setattr(comm, "get_world_size", lambda: world)
    monkeypatch.setattr(comm, "get_rank", lambda: rank)
    cfg = get_cfg()
    cfg.merge_from_file(MAIN_JOB)
    cfg.merge_from_list(["DATASETS.ROOT", data_root, "DATASETS.NAMES", ("SyntheticReIDTiny",), "INPUT.SIZE_TRAIN",
                         [64, 32], "SOLVER.IMS_PER_BATCH", 32, "DATALOADER.NUM_WORKERS", 0])
    return build_reid_train_loader(cfg)


def _global_steps(loaders, n):
    """The first `n` steps of the workers' loaders: (global image indices in rank order, their images)."""
    indices = {path: i for i, (path, _, _) in enumerate(loaders[0].dataset.items)}
    steps = []
    for shares in itertools.islice(zip(*loaders), n):
        steps.append(([indices[p] for share in shares for p in share["img_paths"]],
                      torch.cat([share["images"] for share in shares])))
    return steps


@pytest.mark.parametrize("stop", [3, 9])  # in the first epoch, and mid-way in a later one
def test_a_two_worker_run_resumed_on_one_worker_trains_on_its_global_batches(data_root, monkeypatch, stop):
    two = [_loader(data_root, rank, 2, monkeypatch) for rank in range(2)]
    uninterrupted = _global_steps(two, STEPS)
    assert len({tuple(ids) for ids, _ in uninterrupted}) == STEPS and all(len(ids) == 32 for ids, _ in uninterrupted)

    stopped = [_loader(data_root, rank, 2, monkeypatch) for rank in range(2)]
    before = _global_steps(stopped, stop)
    state = stopped[0].state_dict()  # what rank 0 saves in the checkpoint
    assert state == {"seed": 0, "num_batches": stop, "batch_size": 16, "world_size": 2}
    one = _loader(data_root, 0, 1, monkeypatch)
    one.load_state_dict(state)
    after = _global_steps([one], STEPS - stop)

    for step, ((ids, images), (want_ids, want_images)) in enumerate(zip(before + after, uninterrupted)):
        assert ids == want_ids, f"step {step}: other images or another order"
        assert torch.equal(images, want_images), f"step {step}: augmented otherwise"
