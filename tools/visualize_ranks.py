#!/usr/bin/env python
"""Look at what a trained model retrieves: rank lists, ROC curve and distance histograms.

    python tools/visualize_ranks.py --config-file cfg.yml --output vis/ --worst 10 \\
        MODEL.WEIGHTS output/model_final.pth
    python tools/visualize_ranks.py --config-file cfg.yml --output vis/ --query-index 0 17 42 \\
        --topk 8 --dataset Market1501 MODEL.WEIGHTS output/model_final.pth

For each chosen query (--query-index) or each of the N queries with the lowest average
precision (--worst N; the default is --worst 5), `rank_q<index>.png` shows the query
and its top-k gallery images with a green border for a correct match (same identity),
red for a wrong one, and the distance, identity and camera under each. As in the
evaluation protocol, gallery images of the query's identity taken by the query's camera
are left out. `roc.png` plots the ROC curve over all valid query-gallery pairs
(positives: same identity, other camera) and `distance_hist.png` the distance
distributions of positive and negative pairs. Distances use TEST.METRIC on the
model's features (no re-ranking or query expansion).

Needs matplotlib (pip install matplotlib).
"""
import logging
import os
import sys
from typing import List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from reid_engine.data import read_image  # noqa: E402
from reid_engine.engine.cli import build_config  # noqa: E402
from reid_engine.engine.defaults import default_argument_parser  # noqa: E402
from reid_engine.engine.inference_tools import (  # noqa: E402
    ToolError,
    extract_shard_features,
    inference_config,
    load_dataset,
    require_module,
    run_tool,
)
from reid_engine.engine.predictor import DefaultPredictor  # noqa: E402
from reid_engine.evaluation.distance import compute_distance_matrix  # noqa: E402
from reid_engine.evaluation.rank import RankAccumulator  # noqa: E402
from reid_engine.evaluation.roc import RocAccumulator  # noqa: E402
from reid_engine.utils.logger import setup_logger  # noqa: E402

PROG = "visualize_ranks"
logger = logging.getLogger("reid_engine.tools.visualize_ranks")

# Layout of a rank-list figure, in inches at DPI: one column per image.
DPI = 100
CELL_WIDTH_IN = 1.3
RANK_FIGURE_HEIGHT_IN = 3.4
THUMB_SIZE = (64, 128)  # (width, height) of each shown image, in pixels
BORDER_PX = 5
COLOURS = {"query": (40, 90, 200), "match": (20, 170, 60), "wrong": (215, 30, 30)}
# Size of the ROC and histogram figures, in inches at DPI.
CURVE_FIGURE_IN = (6.4, 4.8)
ROC_FPR_MARKS = (1e-4, 1e-3, 1e-2)
DEFAULT_WORST = 5


def build_parser():
    """`default_argument_parser()` plus the visualisation flags."""
    parser = default_argument_parser(epilog=__doc__)
    parser.add_argument("--output", required=True, help="folder for the PNG files")
    parser.add_argument("--dataset", default="", help="registered test set (default: DATASETS.TESTS[0])")
    parser.add_argument("--query-index", type=int, nargs="+", default=[], help="query indices to show")
    parser.add_argument("--worst", type=int, default=None,
                        help=f"show the N queries with the lowest AP (default {DEFAULT_WORST} "
                        "without --query-index, else 0)")
    parser.add_argument("--topk", type=int, default=10, help="gallery images per rank list")
    return parser


def rank_figure_size(topk: int) -> Tuple[int, int]:
    """(width, height) in pixels of a rank-list PNG with `topk` gallery images."""
    return int(round(CELL_WIDTH_IN * (topk + 1) * DPI)), int(round(RANK_FIGURE_HEIGHT_IN * DPI))


def curve_figure_size() -> Tuple[int, int]:
    """(width, height) in pixels of the ROC and histogram PNGs."""
    return int(round(CURVE_FIGURE_IN[0] * DPI)), int(round(CURVE_FIGURE_IN[1] * DPI))


def _figure(size_in: Tuple[float, float]):
    """A matplotlib Figure on the Agg canvas (no pyplot state, no display needed)."""
    require_module("matplotlib", "visualize_ranks")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size_in, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


# --------------------------------------------------------------------------- choosing and ranking


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
        raise ToolError(f"--query-index {bad[0]} is out of range: the query set has {num_query} images "
                        f"(0..{num_query - 1})")
    chosen = list(dict.fromkeys(int(i) for i in query_indices))
    candidates = np.flatnonzero(valid)
    order = np.lexsort((candidates, ap[candidates]))  # by AP, then by index
    chosen += [i for i in candidates[order][:worst].tolist() if i not in chosen]
    return chosen


def ranked_gallery(dist_row: np.ndarray, q_pid: int, q_camid: int, g_pids: np.ndarray,
                   g_camids: np.ndarray, topk: int) -> np.ndarray:
    """Indices of the top-k gallery items of one query, same-identity-same-camera items left out.

    Ties keep gallery order (a stable sort), as in the evaluation.
    """
    order = np.argsort(dist_row, kind="stable")
    junk = (g_pids[order] == q_pid) & (g_camids[order] == q_camid)
    return order[~junk][:topk]


# --------------------------------------------------------------------------- drawing


def bordered_thumbnail(path: str, colour: Tuple[int, int, int]) -> np.ndarray:
    """The image at `path` resized to THUMB_SIZE, framed by a BORDER_PX border of `colour`."""
    img = np.asarray(read_image(path).resize(THUMB_SIZE, Image.BICUBIC))
    framed = np.empty((img.shape[0] + 2 * BORDER_PX, img.shape[1] + 2 * BORDER_PX, 3), dtype=np.uint8)
    framed[:] = colour
    framed[BORDER_PX:-BORDER_PX, BORDER_PX:-BORDER_PX] = img
    return framed


def draw_rank_list(path: str, query: Tuple[str, int, int], gallery: Sequence[Tuple[str, int, int]],
                   ranked: Sequence[int], distances: Sequence[float], title: str) -> str:
    """Save one rank-list PNG: the query, then its ranked gallery images.

    Args:
        path: PNG file to write.
        query: the query item.
        gallery: all gallery items.
        ranked: the gallery indices to show, best first.
        distances: their distances to the query.
        title: the figure title.
    Returns:
        `path`.
    """
    topk = len(ranked)
    fig = _figure((CELL_WIDTH_IN * (topk + 1), RANK_FIGURE_HEIGHT_IN))
    fig.suptitle(title, fontsize=10)
    axes = fig.subplots(1, topk + 1, squeeze=False)[0]
    fig.subplots_adjust(left=0.01, right=0.99, top=0.84, bottom=0.2, wspace=0.12)
    cells = [(query, COLOURS["query"], f"query\nid {query[1]}  cam {query[2]}")]
    for rank, (g, d) in enumerate(zip(ranked, distances), 1):
        item = gallery[g]
        correct = item[1] == query[1]
        cells.append((item, COLOURS["match" if correct else "wrong"],
                      f"#{rank}  d={d:.4f}\nid {item[1]}  cam {item[2]}"))
    for ax, (item, colour, text) in zip(axes, cells):
        ax.imshow(bordered_thumbnail(item[0], colour))
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_xlabel(text, fontsize=8, color=tuple(c / 255 for c in colour))
    fig.savefig(path, dpi=DPI)
    return path


def draw_roc(path: str, fpr: np.ndarray, tpr: np.ndarray, marks: dict, num_pos: int, num_neg: int) -> str:
    """Save the ROC curve (log-scale false positive rate) with the TPR at the usual FPRs marked.

    Args:
        path: PNG file to write.
        fpr, tpr: the curve, sorted by FPR.
        marks: {fpr: tpr} points to mark and label.
        num_pos, num_neg: pair counts (for the title).
    Returns:
        `path`.
    """
    fig = _figure(CURVE_FIGURE_IN)
    ax = fig.subplots()
    fig.subplots_adjust(left=0.12, right=0.96, top=0.9, bottom=0.12)
    floor = 1.0 / max(num_neg, 1)  # the smallest non-zero FPR these pairs can show
    ax.step(fpr, tpr, where="post", color="tab:blue", lw=2)
    lines = []
    for mark, value in sorted(marks.items()):
        ax.plot([mark], [value], "o", color="tab:red", clip_on=False)
        lines.append(f"TPR@FPR={mark:.0e}: {value:.1%}")
    if lines:  # a box in the empty upper-left corner, away from the curve and the ticks
        ax.text(0.03, 0.96, "\n".join(lines), transform=ax.transAxes, va="top", fontsize=9, color="tab:red",
                bbox={"facecolor": "white", "edgecolor": "0.7", "boxstyle": "round"})
    ax.set_xscale("log")
    ax.set_xlim(floor, 1.0)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(f"ROC over {num_pos} positive / {num_neg} negative query-gallery pairs", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.savefig(path, dpi=DPI)
    return path


def draw_distance_histograms(path: str, positive: np.ndarray, negative: np.ndarray, metric: str) -> str:
    """Save the distance distributions of positive and negative pairs (densities, shared bins)."""
    fig = _figure(CURVE_FIGURE_IN)
    ax = fig.subplots()
    fig.subplots_adjust(left=0.12, right=0.96, top=0.9, bottom=0.12)
    both = np.concatenate([positive, negative])
    bins = np.linspace(float(both.min()), float(both.max()) + 1e-6, 51)
    ax.hist(negative, bins=bins, density=True, alpha=0.55, color="tab:red",
            label=f"different identity ({len(negative)})")
    ax.hist(positive, bins=bins, density=True, alpha=0.55, color="tab:green",
            label=f"same identity ({len(positive)})")
    ax.set_xlabel(f"{metric} distance")
    ax.set_ylabel("density")
    ax.set_title("Query-gallery distances (same-identity same-camera pairs left out)", fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=DPI)
    return path


# --------------------------------------------------------------------------- the tool


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
        raise ToolError("every query-gallery pair shares an identity: no negative pairs for a ROC curve")
    floor = 1.0 / num_negatives
    targets = sorted(set(np.geomspace(floor, 1.0, points).tolist()) | {1.0} | {f for f in ROC_FPR_MARKS if f >= floor})
    roc = RocAccumulator(q_pids, g_pids, q_camids, g_camids, fprs=targets)
    roc.update(0, distmat)
    tpr = roc.summarize()
    positive = torch.cat(roc.positives).numpy() if roc.positives else np.zeros(0)
    return {"fpr": np.array(targets), "tpr": np.array([tpr[f] for f in targets]),
            "marks": {f: tpr[f] for f in ROC_FPR_MARKS if f in tpr}, "positive": positive,
            "negative": roc.smallest.numpy()}


def visualize(cfg, output_dir: str, dataset_name: str = "", query_indices: Sequence[int] = (),
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
    require_module("matplotlib", "visualize_ranks")
    if topk < 1:
        raise ToolError(f"--topk must be at least 1, got {topk}")
    if worst is not None and worst < 0:
        raise ToolError(f"--worst must be >= 0, got {worst}")
    cfg = inference_config(cfg)
    dataset_name, dataset = load_dataset(cfg, dataset_name)
    query, gallery = list(dataset.query), list(dataset.gallery)
    if not query or not gallery:
        raise ToolError(f"{dataset_name} has an empty query or gallery split")

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


def main(args) -> None:
    """Build the config and draw."""
    require_module("matplotlib", "visualize_ranks")  # fail before the model is built
    visualize(build_config(args), args.output, args.dataset, args.query_index, args.worst, args.topk)


if __name__ == "__main__":
    setup_logger()
    sys.exit(run_tool(PROG, main, build_parser().parse_args()))
