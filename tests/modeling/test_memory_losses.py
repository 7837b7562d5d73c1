"""ClusterMemory and CameraProxyMemory against hand computations; their updates, state and workers."""
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from reid_engine.modeling.losses import CameraProxyMemory, ClusterMemory

from ._helpers import run_loss_on_two_workers


def _unit(*rows):
    return F.normalize(torch.tensor(rows, dtype=torch.float32), dim=1)


CENTROIDS = _unit([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0])


def test_cluster_memory_loss_is_the_hand_computed_cluster_nce():
    memory = ClusterMemory(3, temp=0.5)
    memory.reset(CENTROIDS * 2.0)  # normalised on reset
    feats = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 4.0]])
    loss = memory(feats, torch.tensor([0, 2]))
    # Sample 0: similarities (1, 0, 0) / 0.5; sample 1: (0, 0.6, 0.8) / 0.5.
    first = -math.log(math.exp(2.0) / (math.exp(2.0) + 2.0))
    second = -math.log(math.exp(1.6) / (1.0 + math.exp(1.2) + math.exp(1.6)))
    assert loss.item() == pytest.approx((first + second) / 2, rel=1e-6)


def test_cluster_memory_mean_update_runs_in_backward_sample_by_sample():
    memory = ClusterMemory(3, momentum=0.25)
    memory.reset(CENTROIDS)
    feats = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0]], requires_grad=True)
    targets = torch.tensor([0, 0, 1])
    loss = memory(feats, targets)
    assert torch.equal(memory.features, CENTROIDS)  # nothing moves before backward
    loss.backward()
    unit = F.normalize(feats.detach(), dim=1)
    row0 = F.normalize(0.25 * CENTROIDS[0] + 0.75 * unit[0], dim=0)
    row0 = F.normalize(0.25 * row0 + 0.75 * unit[1], dim=0)  # the second sample of cluster 0 after the first
    row1 = F.normalize(0.25 * CENTROIDS[1] + 0.75 * unit[2], dim=0)
    np.testing.assert_allclose(memory.features.numpy(), torch.stack([row0, row1, CENTROIDS[2]]).numpy(), atol=1e-6)


def test_cluster_memory_hard_update_uses_the_least_similar_sample():
    memory = ClusterMemory(3, momentum=0.5, mode="hard")
    memory.reset(CENTROIDS)
    feats = torch.tensor([[1.0, 0.1, 0.0], [1.0, 0.0, 0.9], [1.0, 0.5, 0.0], [0.0, 0.2, 1.0]], requires_grad=True)
    memory(feats, torch.tensor([0, 0, 0, 2])).backward()
    unit = F.normalize(feats.detach(), dim=1)
    # Cluster 0: similarities to (1, 0, 0) are 0.995, 0.743, 0.894: sample 1 is the hardest.
    expected = torch.stack([F.normalize(0.5 * CENTROIDS[0] + 0.5 * unit[1], dim=0), CENTROIDS[1],
                            F.normalize(0.5 * CENTROIDS[2] + 0.5 * unit[3], dim=0)])
    np.testing.assert_allclose(memory.features.numpy(), expected.numpy(), atol=1e-6)


def test_cluster_memory_gradient_is_that_of_the_plain_formula():
    memory = ClusterMemory(3, temp=0.05)
    memory.reset(CENTROIDS)
    feats = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    targets = torch.tensor([0, 1, 2, 1, 0])
    memory(feats, targets).backward()
    plain = feats.detach().clone().requires_grad_()
    F.cross_entropy(F.normalize(plain, dim=1) @ CENTROIDS.t() / 0.05, targets).backward()
    assert feats.grad.abs().sum() > 0
    np.testing.assert_allclose(feats.grad.numpy(), plain.grad.numpy(), atol=1e-5)


def test_cluster_memory_without_backward_does_not_update():
    memory = ClusterMemory(3)
    memory.reset(CENTROIDS)
    with torch.no_grad():
        memory(torch.ones(2, 3), torch.tensor([0, 1]))
    memory(torch.ones(2, 3), torch.tensor([0, 1]))  # inputs that need no gradient: no backward either
    assert torch.equal(memory.features, CENTROIDS)


def test_cluster_memory_state_dict_round_trip_with_another_cluster_count():
    saved = ClusterMemory(3, mode="hard")
    saved.reset(torch.randn(7, 3))
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), ClusterMemory(3, mode="hard"))
    model[1].reset(torch.randn(2, 3))
    model[1].load_state_dict(saved.state_dict())
    assert torch.equal(model[1].features, saved.features) and model[1].num_clusters == 7
    state = model.state_dict()  # nested under a prefix, and back to an empty memory
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 3), ClusterMemory(3, mode="hard"))
    fresh.load_state_dict(state)
    assert torch.equal(fresh[1].features, saved.features)


def test_cluster_memory_errors():
    memory = ClusterMemory(3)
    with pytest.raises(RuntimeError, match="reset"):
        memory(torch.ones(1, 3), torch.tensor([0]))
    memory.reset(CENTROIDS)
    with pytest.raises(ValueError, match="0..2"):
        memory(torch.ones(1, 3), torch.tensor([3]))
    with pytest.raises(ValueError, match="mode"):
        ClusterMemory(3, mode="median")
    with pytest.raises(ValueError, match=r"\(C, 3\)"):
        memory.reset(torch.ones(2, 4))


# ---- camera-aware proxies -------------------------------------------------------------------

FEATS = torch.tensor([[1.0, 0.2, 0.0], [0.8, 0.0, 0.3], [0.0, 1.0, 0.1], [0.1, 0.9, 0.0], [0.0, 0.1, 1.0],
                      [0.3, 0.3, 0.3]])
LABELS = np.array([0, 0, 1, 1, 2, -1])
CAMS = np.array([0, 1, 0, 0, 1, 1])


def _proxy_memory(**kw):
    memory = CameraProxyMemory(3, **kw)
    memory.reset(FEATS, LABELS, CAMS)
    return memory


def test_proxies_are_the_per_camera_cluster_means():
    memory = _proxy_memory()
    assert memory.proxy_label.tolist() == [0, 0, 1, 2] and memory.proxy_camera.tolist() == [0, 1, 0, 1]
    expected = F.normalize(torch.stack([FEATS[0], FEATS[1], (FEATS[2] + FEATS[3]) / 2, FEATS[4]]), dim=1)
    np.testing.assert_allclose(memory.proxies.numpy(), expected.numpy(), atol=1e-6)


def _cap_reference(memory, feats, targets, camids, k):
    """CAP's losses one sample at a time."""
    intra = inter = 0.0
    for f, y, c in zip(F.normalize(feats, dim=1), targets.tolist(), camids.tolist()):
        sims = (memory.proxies @ f / memory.temp).tolist()
        own = [p for p in range(memory.num_proxies) if memory.proxy_camera[p] == c]
        positive = [p for p in own if memory.proxy_label[p] == y][0]
        intra += -sims[positive] + math.log(sum(math.exp(sims[p]) for p in own))
        pos = [p for p in range(memory.num_proxies) if memory.proxy_label[p] == y]
        neg = sorted((p for p in range(memory.num_proxies) if p not in pos), key=lambda p: -sims[p])[:k]
        norm = math.log(sum(math.exp(sims[p]) for p in pos + neg))
        inter += sum(norm - sims[p] for p in pos) / len(pos)
    return intra / len(targets), inter / len(targets)


@pytest.mark.parametrize("hard_negatives", [1, 50])
def test_camera_proxy_losses_match_a_per_sample_computation(hard_negatives):
    memory = _proxy_memory(temp=0.5, hard_negatives=hard_negatives)
    feats = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    targets, camids = torch.tensor([0, 1, 0, 2]), torch.tensor([1, 0, 0, 1])
    losses = memory(feats, targets, camids)
    intra, inter = _cap_reference(memory, feats, targets, camids, hard_negatives)
    assert losses["loss_intra_camera"].item() == pytest.approx(intra, rel=1e-5)
    assert losses["loss_inter_camera"].item() == pytest.approx(inter, rel=1e-5)


def test_camera_proxy_update_and_gradient():
    memory = _proxy_memory(momentum=0.2)
    before = memory.proxies.clone()
    feats = torch.randn(3, 3, generator=torch.Generator().manual_seed(2), requires_grad=True)
    losses = memory(feats, torch.tensor([1, 0, 1]), torch.tensor([0, 1, 0]))
    assert torch.equal(memory.proxies, before)
    (losses["loss_intra_camera"] + losses["loss_inter_camera"]).backward()
    assert feats.grad is not None and feats.grad.abs().sum() > 0
    unit = F.normalize(feats.detach(), dim=1)
    proxy2 = F.normalize(0.2 * F.normalize(0.2 * before[2] + 0.8 * unit[0], dim=0) + 0.8 * unit[2], dim=0)
    expected = torch.stack([before[0], F.normalize(0.2 * before[1] + 0.8 * unit[1], dim=0), proxy2, before[3]])
    np.testing.assert_allclose(memory.proxies.numpy(), expected.numpy(), atol=1e-6)


def test_camera_proxy_state_dict_resizes_and_errors_are_clear():
    saved = _proxy_memory()
    other = CameraProxyMemory(3)
    other.reset(torch.randn(2, 3), np.array([0, 0]), np.array([0, 0]))
    other.load_state_dict(saved.state_dict())
    for name in ("proxies", "proxy_label", "proxy_camera"):
        assert torch.equal(getattr(other, name), getattr(saved, name))
    with pytest.raises(ValueError, match="no proxy for cluster 2 in camera 0"):
        saved(torch.ones(1, 3), torch.tensor([2]), torch.tensor([0]))
    with pytest.raises(RuntimeError, match="reset"):
        CameraProxyMemory(3)(torch.ones(1, 3), torch.tensor([0]), torch.tensor([0]))


# ---- across workers ---------------------------------------------------------------------------

def _memory_loss(local, targets):
    memory = ClusterMemory(3, momentum=0.3)
    memory.reset(CENTROIDS)
    return memory(local, targets), memory


def test_cluster_memory_workers_update_with_the_whole_batch(tmp_path):
    feats = torch.randn(6, 3, generator=torch.Generator().manual_seed(3))
    targets = torch.tensor([0, 1, 0, 2, 0, 1])
    results = run_loss_on_two_workers(_memory_loss, feats, targets, tmp_path)
    whole = ClusterMemory(3, momentum=0.3)
    whole.reset(CENTROIDS)
    whole(feats.clone().requires_grad_(), targets).backward()
    for rank, result in enumerate(results):
        np.testing.assert_allclose(result["state"]["features"].numpy(), whole.features.numpy(), atol=1e-6)
        local = ClusterMemory(3)
        local.reset(CENTROIDS)
        assert result["loss"].item() == pytest.approx(local(feats.chunk(2)[rank], targets.chunk(2)[rank]).item(), rel=1e-6)
