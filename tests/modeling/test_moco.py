"""MoCo: the feature queue (ring buffer, gathered from all workers), its CosFace loss, the
MODEL.QUEUE_SIZE check, and exact resume of the queue through DefaultTrainer."""
import logging
import math
import os

import pytest
import torch
from torch.nn import functional as F

from reid_engine.config import ConfigError, get_cfg
from reid_engine.engine.launch import launch
from reid_engine.modeling.meta_arch import META_ARCH_REGISTRY, MoCo
from reid_engine.modeling.meta_arch.moco import FeatureQueue, memory_cosface_loss
from tests.conftest import REPO_ROOT

TINY_CFG = os.path.join(REPO_ROOT, "tests", "e2e", "configs", "tiny_R18.yml")


def _tiny_cfg(**overrides):
    cfg = get_cfg()
    cfg.merge_from_file(TINY_CFG)
    opts = {"MODEL.META_ARCHITECTURE": "MoCo", "MODEL.HEADS.NUM_CLASSES": 5, "MODEL.QUEUE_SIZE": 16,
            "SOLVER.IMS_PER_BATCH": 8, **overrides}
    cfg.merge_from_list([x for kv in opts.items() for x in kv])
    return cfg


def _batch(index, n=4, dim=3):
    g = torch.Generator().manual_seed(index)
    return F.normalize(torch.randn(n, dim, generator=g), dim=1), torch.randint(0, 9, (n,), generator=g)


# ----------------------------------------------------------------- the ring buffer


@pytest.mark.parametrize("batch_size", [3, 4, 6])
def test_queue_wraps_around(batch_size):
    size, steps = 12, 7
    queue = FeatureQueue(3, size)
    initial = queue.queue.clone()
    assert torch.allclose(initial.norm(dim=0), torch.ones(size))  # random unit columns
    batches = [_batch(i, batch_size) for i in range(steps)]
    for i, (feats, labels) in enumerate(batches):
        first = (i * batch_size) % size
        assert queue.enqueue(feats, labels).tolist() == list(range(first, first + batch_size))  # this worker's columns
        assert int(queue.queue_ptr) == ((i + 1) * batch_size) % size
    # Column c belongs to slot c // b; it holds the newest batch written to that slot.
    slots = size // batch_size
    for c in range(size):
        written = [i for i in range(steps) if i % slots == c // batch_size]
        if not written:
            assert torch.equal(queue.queue[:, c], initial[:, c]) and queue.queue_label[0, c] == 0
            continue
        feats, labels = batches[written[-1]]
        assert torch.equal(queue.queue[:, c], feats[c % batch_size])
        assert queue.queue_label[0, c] == labels[c % batch_size]


def test_queue_state_is_in_the_state_dict_under_fastreid_names():
    model = MoCo.from_config(_tiny_cfg())
    state = model.state_dict()
    assert state["memory.queue"].shape == (512, 16)  # R18 pooled feature (NECK_FEAT before)
    assert state["memory.queue_label"].shape == (1, 16) and state["memory.queue_label"].dtype == torch.long
    assert state["memory.queue_ptr"].shape == (1,) and state["memory.queue_ptr"].dtype == torch.long
    embedded = MoCo.from_config(_tiny_cfg(**{"MODEL.HEADS.EMBEDDING_DIM": 32, "MODEL.HEADS.NECK_FEAT": "after"}))
    assert embedded.memory.queue.shape == (32, 16)


def test_training_step_enqueues_the_head_features_and_adds_loss_mb():
    torch.manual_seed(0)
    model = MoCo.from_config(_tiny_cfg()).train()
    seen = {}
    model.heads.register_forward_hook(lambda m, i, out: seen.update(out) if m.training else None)
    batch = {"images": torch.rand(8, 3, 64, 32) * 255, "targets": torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])}
    losses = model(batch)
    assert set(losses) == {"loss_cls", "loss_triplet", "loss_mb"}
    loss_mb = float(losses["loss_mb"].detach())
    assert math.isfinite(loss_mb) and loss_mb > 0
    assert int(model.memory.queue_ptr) == 8
    expected = F.normalize(seen["features"].detach(), dim=1).t()
    assert torch.allclose(model.memory.queue[:, :8], expected, atol=1e-6)
    assert model.memory.queue_label[0, :8].tolist() == batch["targets"].tolist()
    sum(losses.values()).backward()  # the memory loss reaches the backbone
    assert model.backbone.conv1.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        assert model(batch["images"]).shape == (8, 512)
    assert int(model.memory.queue_ptr) == 8  # eval leaves the queue alone


# ----------------------------------------------------------------- the loss


def _hand_cosface(feats, targets, memory, labels, self_cols, margin=0.25, gamma=32.0):
    """The loss with plain Python loops over anchors and memory columns."""
    total = 0.0
    for i in range(len(targets)):
        sims = [sum(feats[i][d] * memory[d][j] for d in range(len(feats[i]))) for j in range(len(labels))]
        pos = [-gamma * s for j, s in enumerate(sims) if labels[j] == targets[i] and j != self_cols[i]]
        neg = [gamma * (s + margin) for j, s in enumerate(sims) if labels[j] != targets[i]]
        if not pos:  # no positive: fast-reid's masking makes the term softplus(-huge) = 0
            continue
        lse = math.log(sum(math.exp(v) for v in pos)) + math.log(sum(math.exp(v) for v in neg))
        total += math.log1p(math.exp(lse))
    return total / len(targets)


def test_loss_equals_a_hand_computation():
    angles = [0.0, 0.3, 1.2, 2.5, -0.7, 1.9]
    memory = torch.tensor([[math.cos(a) for a in angles], [math.sin(a) for a in angles]])
    labels = torch.tensor([1, 1, 2, 2, 1, 5])
    # the anchors are the first three columns (their own copies); label 4 has no positive
    feats = memory[:, [2, 3, 4]].t().contiguous()
    targets, self_cols = torch.tensor([2, 2, 4]), torch.tensor([2, 3, 4])
    loss = memory_cosface_loss(feats, targets, memory, labels, self_cols)
    expected = _hand_cosface(feats.tolist(), targets.tolist(), memory.tolist(), labels.tolist(), self_cols.tolist())
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert expected > 0


def test_forward_excludes_each_anchors_own_copy_wherever_it_was_written():
    queue = FeatureQueue(3, 8)
    queue.enqueue(*_batch(0))  # the next batch lands at columns 4..7
    feats, labels = _batch(1)
    loss = queue(feats, labels)
    expected = _hand_cosface(feats.tolist(), labels.tolist(), queue.queue.tolist(), queue.queue_label[0].tolist(),
                             [4, 5, 6, 7])
    assert float(loss) == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------- MODEL.QUEUE_SIZE


def test_queue_size_not_a_multiple_of_the_global_batch_is_a_config_error():
    cfg = _tiny_cfg(**{"MODEL.QUEUE_SIZE": 20})
    message = ("MODEL.QUEUE_SIZE (20) must be a positive multiple of SOLVER.IMS_PER_BATCH (8), the features "
               "every step enqueues; set it to e.g. 16")
    with pytest.raises(ConfigError) as info:
        META_ARCH_REGISTRY.check_config(cfg)  # the check every run does before building anything
    assert str(info.value) == message
    with pytest.raises(ConfigError, match=r"MODEL.QUEUE_SIZE \(20\)"):
        MoCo.from_config(cfg)
    with pytest.raises(ConfigError, match=r"MODEL.QUEUE_SIZE \(0\)"):
        META_ARCH_REGISTRY.check_config(_tiny_cfg(**{"MODEL.QUEUE_SIZE": 0}))
    with pytest.raises(ValueError, match="not a multiple of the 3 enqueued"):
        FeatureQueue(3, 8).enqueue(*_batch(0, n=3))


# ----------------------------------------------------------------- two workers


def two_worker_queue_main(out_dir):
    """Worker: one queue (same start on both), three steps of rank-dependent features."""
    from reid_engine.utils import comm

    rank = comm.get_rank()
    torch.manual_seed(0)
    queue = FeatureQueue(3, 8)
    losses = []
    for step in range(3):  # global batch 4: columns 0-3, 4-7, then 0-3 again
        feats, _ = _batch(10 * step + rank, n=2)
        labels = torch.tensor([rank, 7])
        losses.append(queue(feats, labels))
    torch.save({"state": queue.state_dict(), "loss": losses[-1]}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.slow
def test_two_gloo_workers_fill_identical_queues_with_both_workers_features(tmp_path):
    launch(two_worker_queue_main, 2, dist_url="auto", args=(str(tmp_path),), backend="gloo")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    for key in ("queue", "queue_label", "queue_ptr"):
        assert torch.equal(r0["state"][key], r1["state"][key])
    state = r0["state"]
    assert int(state["queue_ptr"]) == 4
    for step, first in ((2, 0), (1, 4)):  # the newest writes to each half, rank 0 then rank 1
        for rank in range(2):
            feats, _ = _batch(10 * step + rank, n=2)
            cols = slice(first + 2 * rank, first + 2 * rank + 2)
            assert torch.allclose(state["queue"][:, cols], feats.t(), atol=1e-6)  # renormalised
            assert state["queue_label"][0, cols].tolist() == [rank, 7]
    # each worker's loss excludes its own columns (rank r wrote at 2r, 2r + 1 in the last step)
    for rank, result in enumerate((r0, r1)):
        feats, _ = _batch(20 + rank, n=2)
        expected = _hand_cosface(feats.tolist(), [rank, 7], state["queue"].tolist(), state["queue_label"][0].tolist(),
                                 [2 * rank, 2 * rank + 1])
        assert float(result["loss"]) == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------- exact resume


def _trainer(out_dir, data_root, max_iter):
    """A quarter-width DefaultTrainer of MoCo (batch 8, queue of 3 batches) stopping after ``max_iter`` steps,
    with the evaluation stubbed out (it is not what is tested and dominates the time)."""
    from reid_engine.engine.defaults import DefaultTrainer
    from reid_engine.utils.env import seed_all_rng

    class NoEvalTrainer(DefaultTrainer):
        @classmethod
        def test(cls, cfg, model, evaluators=None, final=False):
            return {}

    cfg = _tiny_cfg(**{"MODEL.QUEUE_SIZE": 24, "MODEL.HEADS.NUM_CLASSES": 0, "DATALOADER.NUM_INSTANCE": 2,
                       "DATASETS.ROOT": data_root, "SOLVER.WARMUP_ITERS": 1, "OUTPUT_DIR": out_dir,
                       "MODEL.BACKBONE.WIDTH_MULT": 0.25})  # a quarter width: the queue resumes the same
    seed_all_rng(cfg.SEED)  # as default_setup: every run starts from the same weights and queue
    trainer = NoEvalTrainer(cfg)
    trainer.max_iter = max_iter  # the last step writes model_final.pth with the whole trainer state
    return trainer


@pytest.mark.slow
def test_resume_through_default_trainer_is_exact(tmp_path):
    logging.getLogger("reid_engine").setLevel(logging.INFO)  # else DefaultTrainer sets up logging
    data_root, steps = str(tmp_path / "data"), 4
    straight = _trainer(str(tmp_path / "straight"), data_root, steps)
    straight.resume_or_load(resume=False)
    straight.train()
    first = _trainer(str(tmp_path / "resumed"), data_root, steps // 2)
    first.resume_or_load(resume=False)
    first.train()
    resumed = _trainer(str(tmp_path / "resumed"), data_root, steps)
    resumed.resume_or_load(resume=True)  # from the first half's model_final.pth
    assert resumed.start_iter == steps // 2
    assert int(resumed.model.memory.queue_ptr) == (steps // 2 * 8) % 24
    resumed.train()
    expected, got = straight.model.state_dict(), resumed.model.state_dict()
    assert expected.keys() == got.keys()
    assert int(got["memory.queue_ptr"]) == (steps * 8) % 24 != 0  # wrapped around once
    assert not torch.equal(got["memory.queue"], first.model.state_dict()["memory.queue"])
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
