"""Drawing the rank-list, ROC and distance-histogram PNGs (matplotlib on the Agg canvas)."""
from typing import List, Sequence, Tuple

import numpy as np
from PIL import Image

from ..data import read_image
from ..data.tracklets import representative_frame
from ..utils.errors import require_module

__all__ = [
    "DPI",
    "THUMB_SIZE",
    "BORDER_PX",
    "COLORS",
    "rank_figure_size",
    "curve_figure_size",
    "bordered_thumbnail",
    "draw_rank_list",
    "draw_rank_rows",
    "draw_roc",
    "draw_distance_histograms",
]

# Layout of a rank-list figure, in inches at DPI: one column per image.
DPI = 100
CELL_WIDTH_IN = 1.3
RANK_FIGURE_HEIGHT_IN = 3.4
THUMB_SIZE = (64, 128)  # (width, height) of each shown image, in pixels
BORDER_PX = 5
COLORS = {"query": (40, 90, 200), "match": (20, 170, 60), "wrong": (215, 30, 30), "unknown": (120, 120, 120)}
# Size of the ROC and histogram figures, in inches at DPI.
CURVE_FIGURE_IN = (6.4, 4.8)


def rank_figure_size(topk: int) -> Tuple[int, int]:
    """(width, height) in pixels of a rank-list PNG with `topk` gallery images."""
    return int(round(CELL_WIDTH_IN * (topk + 1) * DPI)), int(round(RANK_FIGURE_HEIGHT_IN * DPI))


def curve_figure_size() -> Tuple[int, int]:
    """(width, height) in pixels of the ROC and histogram PNGs."""
    return int(round(CURVE_FIGURE_IN[0] * DPI)), int(round(CURVE_FIGURE_IN[1] * DPI))


def _figure(size_in: Tuple[float, float]):
    """A matplotlib Figure on the Agg canvas (no pyplot state, no display needed)."""
    require_module("matplotlib", "rank-list visualization")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size_in, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def bordered_thumbnail(path: str, color: Tuple[int, int, int]) -> np.ndarray:
    """The image at `path` resized to THUMB_SIZE, framed by a BORDER_PX border of `color`."""
    img = np.asarray(read_image(path).resize(THUMB_SIZE, Image.BICUBIC))
    framed = np.empty((img.shape[0] + 2 * BORDER_PX, img.shape[1] + 2 * BORDER_PX, 3), dtype=np.uint8)
    framed[:] = color
    framed[BORDER_PX:-BORDER_PX, BORDER_PX:-BORDER_PX] = img
    return framed


def _rank_cells(query: Tuple[str, int, int], gallery: Sequence[Tuple[str, int, int]], ranked: Sequence[int],
                distances: Sequence[float]) -> List[Tuple[Tuple[str, int, int], Tuple[int, int, int], str]]:
    """(item, border color, caption) of the query and of each ranked gallery image."""
    cells = [(query, COLORS["query"], f"query\nid {query[1]}  cam {query[2]}")]
    for rank, (g, d) in enumerate(zip(ranked, distances), 1):
        item = gallery[g]
        # an identity below 0 is unknown (a folder of crops searched by reid-index): neither right nor wrong
        verdict = "unknown" if min(item[1], query[1]) < 0 else "match" if item[1] == query[1] else "wrong"
        cells.append((item, COLORS[verdict],
                      f"#{rank}  d={d:.4f}\nid {item[1]}  cam {item[2]}"))
    return cells


def _draw_cells(axes, cells) -> None:
    """Show each cell's bordered thumbnail in its axes, captioned in the border color."""
    for ax, (item, color, text) in zip(axes, cells):
        ax.imshow(bordered_thumbnail(representative_frame(item[0]), color))  # a tracklet shows its middle frame
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_xlabel(text, fontsize=8, color=tuple(c / 255 for c in color))


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
    return draw_rank_rows(path, [(query, ranked, distances, "")], gallery, title)


def draw_rank_rows(path: str, rows: Sequence[Tuple[Tuple[str, int, int], Sequence[int], Sequence[float], str]],
                   gallery: Sequence[Tuple[str, int, int]], title: str) -> str:
    """Save several rank lists as the rows of one PNG.

    Args:
        path: PNG file to write.
        rows: per query: (query item, ranked gallery indices best first, their distances,
            a label shown above the query, may be empty).
        gallery: all gallery items.
        title: the figure title.
    Returns:
        `path`.
    """
    topk = max(len(r[1]) for r in rows)
    # Each row keeps the height of a single rank-list figure; the title takes a fixed band on top.
    title_in, captions_in = RANK_FIGURE_HEIGHT_IN * 0.16, RANK_FIGURE_HEIGHT_IN * 0.2
    height_in = (RANK_FIGURE_HEIGHT_IN - title_in) * len(rows) + title_in
    fig = _figure((CELL_WIDTH_IN * (topk + 1), height_in))
    fig.suptitle(title, fontsize=10)
    axes = fig.subplots(len(rows), topk + 1, squeeze=False)
    fig.subplots_adjust(left=0.01, right=0.99, top=1 - title_in / height_in, bottom=captions_in / height_in,
                        wspace=0.12, hspace=0.5)
    for row_axes, (query, ranked, distances, label) in zip(axes, rows):
        _draw_cells(row_axes, _rank_cells(query, gallery, ranked, distances))
        for ax in row_axes[len(ranked) + 1:]:  # a query with fewer candidates than topk
            ax.set_axis_off()
        if label:
            row_axes[0].set_title(label, fontsize=8, loc="left")
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
