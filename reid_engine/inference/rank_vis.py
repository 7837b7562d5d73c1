"""TEST.RANK_VIS: the rank-sheet picture (OUTPUT_DIR/ranks.png) of a run's last evaluation."""
import logging
import os
from typing import Optional

from ..config import CfgNode
from ..utils.errors import MissingPackageError, require_module
from .items import load_dataset
from .rank_lists import draw_rank_sheet

__all__ = ["RANK_VIS_FILE", "write_rank_vis"]

logger = logging.getLogger(__name__)

RANK_VIS_FILE = "ranks.png"


def write_rank_vis(cfg: CfgNode, dataset_name: str, evaluator) -> Optional[str]:
    """Draw OUTPUT_DIR/ranks.png from the features an evaluation just collected (main process).

    The picture is a by-product: when it cannot be drawn (matplotlib missing, an evaluator
    that keeps no features, a drawing error) one line is logged and the run goes on unchanged.

    Args:
        cfg: the config (OUTPUT_DIR, DATASETS.ROOT, TEST.METRIC).
        dataset_name: the evaluated test set.
        evaluator: the evaluator that ran; a ReidEvaluator keeps its features in `collected`.
    Returns:
        the PNG path, or None when it was skipped.
    """
    try:
        require_module("matplotlib", "TEST.RANK_VIS")
    except MissingPackageError:
        logger.warning("TEST.RANK_VIS: matplotlib is not installed; %s skipped (pip install matplotlib)",
                       RANK_VIS_FILE)
        return None
    collected = getattr(evaluator, "collected", None)
    if collected is None or not cfg.OUTPUT_DIR:
        logger.warning("TEST.RANK_VIS: %s; %s skipped",
                       "OUTPUT_DIR is empty" if collected is not None else
                       f"the evaluator {type(evaluator).__name__} keeps no features", RANK_VIS_FILE)
        return None
    path = os.path.join(cfg.OUTPUT_DIR, RANK_VIS_FILE)
    try:
        _, dataset = load_dataset(cfg, dataset_name)
        draw_rank_sheet(path, dataset_name, list(dataset.query), list(dataset.gallery), collected[0],
                        cfg.TEST.METRIC)
    except Exception as e:  # a picture must not fail a run whose results are already computed
        logger.warning("TEST.RANK_VIS: drawing %s failed (%s: %s); the results are unaffected",
                       path, type(e).__name__, e)
        return None
    logger.info("TEST.RANK_VIS: wrote %s", os.path.abspath(path))
    return path
