"""Direct, loop-based implementations of reid-protocol.md, used as test oracles."""
import numpy as np


def protocol_metrics(distmat, q_pids, g_pids, q_camids, g_camids, max_rank=50):
    """CMC / mAP / mINP by the reference pseudo-code, one query at a time."""
    cmcs, aps, inps = [], [], []
    for i in range(distmat.shape[0]):
        order = np.argsort(distmat[i], kind="stable")
        keep = ~((g_pids[order] == q_pids[i]) & (g_camids[order] == q_camids[i]))
        m = (g_pids[order][keep] == q_pids[i]).astype(np.int64)
        if not m.any():
            continue
        c = np.cumsum(m)
        cmc = (c >= 1).astype(np.float64)
        if len(cmc) < max_rank:
            cmc = np.concatenate([cmc, np.full(max_rank - len(cmc), cmc[-1])])
        cmcs.append(cmc[:max_rank])
        hits = np.nonzero(m)[0]
        aps.append((c[hits] / (hits + 1)).sum() / m.sum())
        inps.append(m.sum() / (hits[-1] + 1))
    return np.mean(cmcs, 0), float(np.mean(aps)), float(np.mean(inps))


def dense_v(dist, k1, k2):
    """Steps 2-5 of re-ranking on a dense (row-normalised) pool distance matrix: V after the local expansion."""
    d = np.asarray(dist, dtype=np.float64)
    n = d.shape[0]
    rank = np.argsort(d, axis=1, kind="stable")

    def nearest(p, k):
        return rank[p, : k + 1]

    def reciprocal(p, k):
        return [g for g in nearest(p, k) if p in nearest(g, k)]

    half = int(round(k1 / 2))
    v = np.zeros((n, n))
    for p in range(n):
        r_p = reciprocal(p, k1)
        expanded = set(r_p)
        for q in r_p:
            r_q = reciprocal(q, half)
            if len(set(r_q) & set(r_p)) > 2.0 / 3.0 * len(r_q):
                expanded |= set(r_q)
        idx = sorted(expanded)
        w = np.exp(-d[p, idx])
        v[p, idx] = w / w.sum()
    return np.stack([v[rank[p, :k2]].mean(0) for p in range(n)])


def dense_jaccard(v_query, v_gallery):
    """Step 6: the Jaccard distance of every row of ``v_query`` to every row of ``v_gallery``."""
    jaccard = np.zeros((len(v_query), len(v_gallery)))
    for p, a in enumerate(v_query):
        for g, b in enumerate(v_gallery):
            jaccard[p, g] = 1 - np.minimum(a, b).sum() / np.maximum(a, b).sum()
    return jaccard


def dense_rerank(dist, num_query, k1, k2, lambda_value):
    """k-reciprocal re-ranking step by step on a dense pool distance matrix (N x N)."""
    d = np.asarray(dist, dtype=np.float64)
    v_qe = dense_v(d, k1, k2)
    jaccard = dense_jaccard(v_qe[:num_query], v_qe[num_query:])
    return (1 - lambda_value) * jaccard + lambda_value * d[:num_query, num_query:]
