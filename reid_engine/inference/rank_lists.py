"""Rank-list visualization: embed a test set, rank its gallery, and draw what a model retrieves.

For each chosen query, `rank_q<index>.png` shows the query and its top-k gallery
images (green border: same identity, red: another), with gallery images of the
query's identity taken by the query's camera left out, as in evaluation. `roc.png`
plots the ROC curve over all valid query-gallery pairs and `distance_hist.png` the
distances of positive and negative pairs (TEST.METRIC on the model's features).
"""
import logging
import os
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..config import CfgNode
from ..evaluation.distance import compute_distance_matrix
from ..evaluation.rank import RankAccumulator
from ..evaluation.roc import RocAccumulator
from ..utils.errors import ReidUserError, UsageError, require_module
from .extraction import extract_shard_features
from .items import ImageFolderError, load_dataset
from .model import inference_config
from .predictor import DefaultPredictor
from .rank_figures import draw_distance_histograms, draw_rank_list, draw_rank_rows, draw_roc

__all__ = ["ROC_FPR_MARKS", "DEFAULT_WORST", "SHEET_QUERIES", "NoNegativePairsError", "choose_queries",
           "spread_queries", "ranked_gallery", "roc_curve", "visualize", "draw_rank_sheet"]

logger = logging.getLogger(__name__)

ROC_FPR_MARKS = (1e-4, 1e-3, 1e-2)
DEFAULT_WORST = 5
SHEET_QUERIES = 6  # rows of the one-picture rank sheet (TEST.RANK_VIS)


class NoNegativePairsError(ReidUserError):
    """Every query-gallery pair shares an identity, so there is no ROC curve to draw."""


def choose_queries(ap: np.ndarray, valid: np.ndarray, query_indices: Sequence[int], worst: int) -> List[int]:
    """The queries to draw: the given indices, then the `worst` lowest-AP valid queries.

    Args:
        ap: (Q,) average precision per query.
        valid: (Q,) whether the query has a true match (only those have an AP).
        query_indices: explicit choices.
        worst: how many lowest-AP queries to add (ties: lower index first).
    Returns:
        query indices, without repeats.
    """
    num_query = len(ap)
    bad = [i for i in query_indices if not 0 <= i < num_query]
    if bad:
        raise UsageError(f"--query-index {bad[0]} is out of range: the query set has {num_query} images "
                         f"(0..{num_query - 1})")
    chosen = list(dict.fromkeys(int(i) for i in query_indices))
    candidates = np.flatnonzero(valid)
    order = np.lexsort((candidates, ap[candidates]))  # by AP, then by index
    chosen += [i for i in candidates[order][:worst].tolist() if i not in chosen]
    return chosen


def spread_queries(valid: np.ndarray, count: int) -> List[int]:
    """`count` queries with a true match, evenly spaced over the query list.

    The choice depends only on the test set, not on the model, so the pictures of
    successive runs show the same queries.

    Args:
        valid: (Q,) whether each query has a true match in the gallery.
        count: how many to choose (fewer when fewer are valid).
    Returns:
        ascending query indices.
    """
    candidates = np.flatnonzero(valid)
    if len(candidates) <= count:
        return candidates.tolist()
    picks = np.linspace(0, len(candidates) - 1, count).round().astype(int)
    return candidates[picks].tolist()


def ranked_gallery(dist_row: np.ndarray, q_pid: int, q_camid: int, g_pids: np.ndarray,
                   g_camids: np.ndarray, topk: int) -> np.ndarray:
    """Indices of the top-k gallery items of one query, same-identity-same-camera items left out.

    Ties keep gallery order (a stable sort), as in the evaluation.
    """
    order = np.argsort(dist_row, kind="stable")
    junk = (g_pids[order] == q_pid) & (g_camids[order] == q_camid)
    return order[~junk][:topk]


def roc_curve(distmat: torch.Tensor, q_pids, g_pids, q_camids, g_camids, points: int = 200) -> dict:
    """ROC points and pair distances from the evaluation's ROC accumulator.

    The curve is the TPR at `points` log-spaced FPR targets from 1 / #negatives to 1,
    plus ROC_FPR_MARKS (so the marked values are those the evaluation reports). All
    negative pair distances are kept (8 bytes per query-gallery pair).

    Returns:
        {"fpr", "tpr": arrays sorted by FPR, "marks": {fpr: tpr}, "positive",
        "negative": pair distances (positives: same id, other camera; negatives: other id)}.
    """
    num_negatives = RocAccumulator(q_pids, g_pids, q_camids, g_camids, fprs=(1.0,)).num_negatives
    if num_negatives == 0:
        raise NoNegativePairsError("every query-gallery pair shares an identity: no negative pairs for a ROC curve")
    floor = 1.0 / num_negatives
    targets = sorted(set(np.geomspace(floor, 1.0, points).tolist()) | {1.0} | {f for f in ROC_FPR_MARKS if f >= floor})
    roc = RocAccumulator(q_pids, g_pids, q_camids, g_camids, fprs=targets)
    roc.update(0, distmat)
    tpr = roc.summarize()
    positive = torch.cat(roc.positives).numpy() if roc.positives else np.zeros(0)
    return {"fpr": np.array(targets), "tpr": np.array([tpr[f] for f in targets]),
            "marks": {f: tpr[f] for f in ROC_FPR_MARKS if f in tpr}, "positive": positive,
            "negative": roc.smallest.numpy()}


def visualize(cfg: CfgNode, output_dir: str, dataset_name: str = "", query_indices: Sequence[int] = (),
              worst: Optional[int] = None, topk: int = 10, predictor: Optional[DefaultPredictor] = None) -> List[str]:
    """Embed a test set and write the rank-list, ROC and histogram PNGs.

    Args:
        cfg: the config (model, MODEL.WEIGHTS, DATASETS.ROOT / TESTS, TEST.METRIC).
        output_dir: folder for the PNGs.
        dataset_name: the test set (default: DATASETS.TESTS[0]).
        query_indices: queries to draw.
        worst: also draw the N lowest-AP queries (None: 5 without `query_indices`, else 0).
        topk: gallery images per rank list.
        predictor: an existing predictor to use (default: one built from `cfg`).
    Returns:
        the PNG files written.
    """
    require_module("matplotlib", "rank-list visualization")
    if topk < 1:
        raise UsageError(f"--topk must be at least 1, got {topk}: pass a positive count")
    if worst is not None and worst < 0:
        raise UsageError(f"--worst must be >= 0, got {worst}: pass 0 or more")
    cfg = inference_config(cfg)
    dataset_name, dataset = load_dataset(cfg, dataset_name)
    query, gallery = list(dataset.query), list(dataset.gallery)
    if not query or not gallery:
        raise ImageFolderError(f"{dataset_name} has an empty query or gallery split; check its folders under "
                               "the data root")

    predictor = predictor or DefaultPredictor(cfg)
    _, features = extract_shard_features(predictor, query + gallery, what=f"Embedding {dataset_name}")
    metric = cfg.TEST.METRIC
    dist = compute_distance_matrix(torch.from_numpy(features[:len(query)]), torch.from_numpy(features[len(query):]),
                                   metric)
    distmat = dist.numpy()
    q_pids, q_camids = np.array([q[1] for q in query]), np.array([q[2] for q in query])
    g_pids, g_camids = np.array([g[1] for g in gallery]), np.array([g[2] for g in gallery])
    ranks = RankAccumulator(q_pids, g_pids, q_camids, g_camids)
    ranks.update(0, dist)
    ap, valid = ranks.ap.numpy(), (ranks.num_pos > 0).numpy()

    os.makedirs(output_dir, exist_ok=True)
    written = []
    if worst is None:
        worst = 0 if query_indices else DEFAULT_WORST
    chosen = choose_queries(ap, valid, query_indices, worst)
    for i in chosen:
        ranked = ranked_gallery(distmat[i], q_pids[i], q_camids[i], g_pids, g_camids, topk)
        ap_text = f"AP {ap[i]:.1%}" if valid[i] else "no true match in the gallery"
        title = f"{dataset_name} query {i} (id {q_pids[i]}, cam {q_camids[i]}): {ap_text}"
        written.append(draw_rank_list(os.path.join(output_dir, f"rank_q{i:05d}.png"), query[i], gallery, ranked,
                                      distmat[i, ranked], title))
    roc = roc_curve(dist, q_pids, g_pids, q_camids, g_camids)
    if len(roc["positive"]):
        written.append(draw_roc(os.path.join(output_dir, "roc.png"), roc["fpr"], roc["tpr"], roc["marks"],
                                len(roc["positive"]), len(roc["negative"])))
        written.append(draw_distance_histograms(os.path.join(output_dir, "distance_hist.png"), roc["positive"],
                                                roc["negative"], metric))
    else:
        logger.warning("no positive pair (same identity, other camera): the ROC curve and histograms are skipped")
    for path in written:
        logger.info("Wrote %s", path)
    return written


def draw_rank_sheet(path: str, dataset_name: str, query: Sequence, gallery: Sequence, features: torch.Tensor,
                    metric: str, num_queries: int = SHEET_QUERIES, topk: int = 10) -> str:
    """Draw a few queries with their top-k gallery images as the rows of one PNG.

    Args:
        path: PNG file to write.
        dataset_name: the test set (for the title).
        query, gallery: the (path, pid, camid) items, in the order of `features`.
        features: (len(query) + len(gallery), D) features, queries first (e.g. what the
            evaluation collected).
        metric: TEST.METRIC ("cosine" or "euclidean").
        num_queries: rows (queries with a true match, evenly spaced, see `spread_queries`).
        topk: gallery images per row.
    Returns:
        `path`.
    Raises:
        ValueError: `features` does not match the items, or no query has a true match.
    """
    num_query = len(query)
    if features.shape[0] != num_query + len(gallery):
        raise ValueError(f"{features.shape[0]} features for {num_query} queries + {len(gallery)} gallery items")
    q_pids, q_camids = np.array([q[1] for q in query]), np.array([q[2] for q in query])
    g_pids, g_camids = np.array([g[1] for g in gallery]), np.array([g[2] for g in gallery])
    # A true match: same identity seen by another camera (as in the evaluation).
    valid = np.array([np.any((g_pids == p) & (g_camids != c)) for p, c in zip(q_pids, q_camids)], dtype=bool)
    chosen = spread_queries(valid, num_queries)
    if not chosen:
        raise ValueError(f"no query of {dataset_name} has a true match in its gallery")
    dist = compute_distance_matrix(features[chosen], features[num_query:], metric)
    ranks = RankAccumulator(q_pids[chosen], g_pids, q_camids[chosen], g_camids)
    ranks.update(0, dist)
    ap, distmat = ranks.ap.numpy(), dist.numpy()
    rows = []
    for row, i in enumerate(chosen):
        ranked = ranked_gallery(distmat[row], q_pids[i], q_camids[i], g_pids, g_camids, topk)
        rows.append((query[i], ranked, distmat[row, ranked], f"query {i}: AP {ap[row]:.1%}"))
    title = (f"{dataset_name}: {len(rows)} queries and their top-{topk} gallery images by {metric} distance "
             "(green: same identity, red: another)")
    return draw_rank_rows(path, rows, gallery, title)
