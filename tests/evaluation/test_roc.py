"""TPR at fixed FPR over valid query-gallery pairs."""
import numpy as np
import pytest
import torch

from reid_engine.evaluation import RocAccumulator

G_PIDS, G_CAMS = [1, 2, 3, 1], [1, 1, 1, 0]
Q_PIDS, Q_CAMS = [1, 2], [0, 0]
DIST = torch.tensor([
    [0.2, 0.1, 0.5, 0.05],  # positive 0.2; negatives 0.1, 0.5; g3 same id same camera: excluded
    [0.3, 0.4, 0.6, 0.7],   # positive 0.4; negatives 0.3, 0.6, 0.7
])


@pytest.mark.parametrize("rows_per_block", [1, 2])
def test_hand_computed(rows_per_block):
    roc = RocAccumulator(Q_PIDS, G_PIDS, Q_CAMS, G_CAMS, fprs=(0.1, 0.2, 0.4, 1.0))
    assert roc.num_negatives == 5
    for s in range(0, 2, rows_per_block):
        roc.update(s, DIST[s:s + rows_per_block])
    # negatives sorted: .1 .3 .5 .6 .7; FPR 0.2 allows 1 negative -> threshold below 0.3
    assert roc.summarize() == {0.1: 0.0, 0.2: 0.5, 0.4: 1.0, 1.0: 1.0}


def _brute_force(dist, qp, gp, qc, gc, fpr):
    same = qp[:, None] == gp[None]
    pos = dist[same & (qc[:, None] != gc[None])]
    neg = np.sort(dist[~same])
    m = int(np.floor(fpr * len(neg) + 1e-9))
    bound = neg[m] if m < len(neg) else np.inf
    return (pos < bound).mean()


def test_streaming_matches_brute_force():
    rng = np.random.default_rng(0)
    qp, gp = rng.integers(0, 20, 60), rng.integers(0, 20, 700)
    qc, gc = rng.integers(0, 3, 60), rng.integers(0, 3, 700)
    dist = (rng.random((60, 700)) + 0.5 * (qp[:, None] != gp[None])).astype(np.float32)
    dist[:, :50] = np.round(dist[:, :50], 1)  # ties across blocks
    fprs = (1e-3, 1e-2, 0.1)
    roc = RocAccumulator(qp, gp, qc, gc, fprs=fprs)
    for s in range(0, 60, 7):
        roc.update(s, torch.from_numpy(dist[s:s + 7]))
    got = roc.summarize()
    for f in fprs:
        assert got[f] == pytest.approx(_brute_force(dist, qp, gp, qc, gc, f), abs=1e-12)
    assert roc.smallest.numel() < 0.2 * dist.size  # only the smallest negatives were kept
