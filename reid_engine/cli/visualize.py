"""Look at what a trained model retrieves: rank lists, ROC curve and distance histograms (`reid-visualize`).

    reid-visualize --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --output vis/ \\
        --worst 10 MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth
    reid-visualize --config-file configs/Market1501/bagtricks_R50.yml --output vis/ \\
        --query-index 0,17,42 --topk 8 MODEL.WEIGHTS output/market1501/bagtricks_r50/model_final.pth

--query-index takes one index or a comma list, and may be repeated.

For each chosen query (--query-index) or each of the N queries with the lowest average
precision (--worst N; the default is --worst 5), `rank_q<index>.png` shows the query
and its top-k gallery images with a green border for a correct match (same identity),
red for a wrong one, and the distance, identity and camera under each (a tracklet of a
video set is shown by its middle frame). As in the
evaluation protocol, gallery images of the query's identity taken by the query's camera
are left out. `roc.png` plots the ROC curve over all valid query-gallery pairs
(positives: same identity, other camera) and `distance_hist.png` the distance
distributions of positive and negative pairs. Distances use TEST.METRIC on the
model's features (no re-ranking or query expansion). The same is importable as
`reid_engine.inference.visualize`.

Needs matplotlib (pip install matplotlib).
"""
import argparse
from typing import List, Optional

from ..inference.rank_lists import DEFAULT_WORST, visualize
from ..utils.errors import require_module
from ..utils.logger import setup_logger
from .args import comma_list
from .base import build_config, command_parser
from .boundary import run_command

__all__ = ["PROG", "build_parser", "run", "main"]

PROG = "reid-visualize"


def build_parser() -> argparse.ArgumentParser:
    """The shared base plus the visualization flags."""
    parser = command_parser(PROG, __doc__)
    parser.add_argument("--output", required=True, help="folder for the PNG files")
    parser.add_argument("--dataset", default="", help="registered test set (default: DATASETS.TESTS[0])")
    parser.add_argument("--query-index", type=comma_list(int, what="query index"), action="extend", default=[],
                        metavar="I[,I]", help="query indices to show: a comma list, or the flag repeated")
    parser.add_argument("--worst", type=int, default=None,
                        help=f"show the N queries with the lowest AP (default {DEFAULT_WORST} "
                        "without --query-index, else 0)")
    parser.add_argument("--topk", type=int, default=10, help="gallery images per rank list")
    return parser


def run(args: argparse.Namespace) -> None:
    """Build the config and draw."""
    require_module("matplotlib", "rank-list visualization")  # fail before the model is built
    setup_logger()
    visualize(build_config(args), args.output, args.dataset, args.query_index, args.worst, args.topk)


def main(argv: Optional[List[str]] = None) -> int:
    """Run `reid-visualize` with `argv` (default: sys.argv[1:]); returns the exit status."""
    return run_command(PROG, build_parser(), run, argv)
