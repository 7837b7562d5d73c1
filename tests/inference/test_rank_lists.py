"""reid_engine.inference.rank_lists: PNG sizes, query choice, ranking, borders."""
import os

import numpy as np
import pytest
from PIL import Image

from reid_engine.data.datasets import get_dataset
from reid_engine.inference import rank_figures, rank_lists
from reid_engine.utils.errors import UsageError

from ._helpers import tiny_cfg

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def tool():
    """The visualization API: the ranking and drawing functions and their constants, in one namespace."""
    import types

    names = {**vars(rank_figures), **vars(rank_lists)}
    return types.SimpleNamespace(**{k: v for k, v in names.items() if not k.startswith("__")})


@pytest.mark.slow
def test_pngs_are_written_with_the_expected_size(tool, data_root, tiny_checkpoint, tiny_predictor, tmp_path):
    out = str(tmp_path / "vis")
    written = tool.visualize(tiny_cfg(data_root, tiny_checkpoint), out, query_indices=[3], worst=2, topk=6,
                             predictor=tiny_predictor)
    names = sorted(os.path.basename(p) for p in written)
    assert sorted(os.listdir(out)) == names
    rank_files = [n for n in names if n.startswith("rank_q")]
    # Query 3 plus the two lowest-AP queries (query 3 may be one of them).
    assert "rank_q00003.png" in rank_files and len(rank_files) in (2, 3)
    assert "roc.png" in names and "distance_hist.png" in names
    assert tool.rank_figure_size(6) == (910, 340)
    for name in rank_files:
        with Image.open(os.path.join(out, name)) as img:
            assert img.size == tool.rank_figure_size(6)
            # The query's blue frame is drawn: some pixels carry exactly its color.
            pixels = np.asarray(img.convert("RGB")).reshape(-1, 3)
            assert (pixels == tool.COLORS["query"]).all(axis=1).sum() > 100
    for name in ("roc.png", "distance_hist.png"):
        with Image.open(os.path.join(out, name)) as img:
            assert img.size == tool.curve_figure_size() == (640, 480)


def test_rank_list_borders_are_green_for_matches_and_red_otherwise(tool, data_root, tmp_path):
    items = get_dataset("SyntheticReIDTiny", data_root).gallery
    query = (items[0][0], 7, 0)
    gallery = [(items[1][0], 7, 1), (items[2][0], 8, 1), (items[3][0], 7, 2)]
    path = tool.draw_rank_list(str(tmp_path / "r.png"), query, gallery, [0, 1, 2], [0.1, 0.2, 0.3], "t")
    with Image.open(path) as img:
        assert img.size == tool.rank_figure_size(3)
        pixels = np.asarray(img.convert("RGB")).reshape(-1, 3)
    count = {name: int((pixels == color).all(axis=1).sum()) for name, color in tool.COLORS.items()}
    # Two green frames (plus their green captions), one red frame, one blue.
    assert count["match"] > 1.5 * count["wrong"] > 0 and count["query"] > 0


def test_choose_queries_by_index_and_by_lowest_ap(tool):
    ap = np.array([0.5, 0.2, 0.9, 0.0, 0.2])
    valid = np.array([True, True, True, False, True])
    assert tool.choose_queries(ap, valid, [], worst=2) == [1, 4]  # invalid query 3 never counts
    assert tool.choose_queries(ap, valid, [2], worst=2) == [2, 1, 4]
    assert tool.choose_queries(ap, valid, [4, 4], worst=1) == [4, 1]
    with pytest.raises(UsageError, match="out of range: the query set has 5 images"):
        tool.choose_queries(ap, valid, [5], worst=0)


def test_ranked_gallery_drops_same_id_same_camera(tool):
    dist = np.array([0.3, 0.1, 0.2, 0.1, 0.05])
    g_pids = np.array([1, 1, 2, 3, 1])
    g_camids = np.array([0, 1, 0, 0, 0])
    # Query id 1, camera 0: items 0 and 4 are junk; ties (items 1 and 3) keep gallery order.
    assert tool.ranked_gallery(dist, 1, 0, g_pids, g_camids, topk=2).tolist() == [1, 3]
    assert tool.ranked_gallery(dist, 1, 0, g_pids, g_camids, topk=10).tolist() == [1, 3, 2]


def test_bordered_thumbnail(tool, data_root):
    path = get_dataset("SyntheticReIDTiny", data_root).gallery[0][0]
    framed = tool.bordered_thumbnail(path, (1, 2, 3))
    b = tool.BORDER_PX
    assert framed.shape == (tool.THUMB_SIZE[1] + 2 * b, tool.THUMB_SIZE[0] + 2 * b, 3)
    for edge in (framed[:b], framed[-b:], framed[:, :b], framed[:, -b:]):
        assert (edge == (1, 2, 3)).all()


def test_roc_curve_from_hand_computed_pairs(tool):
    import torch

    # Query 0 (id 1, cam 0): gallery item 0 (id 1, cam 0) is excluded, item 1 (id 1, cam 1)
    # is a positive at 0.2, items 2 and 3 are negatives at 0.1 and 0.5. Query 1 (id 2,
    # cam 1): item 2 (id 2, cam 0) is a positive at 0.3; negatives 0.25, 0.6, 0.7.
    dist = torch.tensor([[0.0, 0.2, 0.1, 0.5], [0.25, 0.6, 0.3, 0.7]], dtype=torch.float64)
    roc = tool.roc_curve(dist, [1, 2], [1, 1, 2, 3], [0, 1], [0, 1, 0, 0], points=5)
    assert sorted(roc["positive"].tolist()) == [0.2, 0.3]
    assert sorted(roc["negative"].tolist()) == [0.1, 0.25, 0.5, 0.6, 0.7]
    # FPR targets from 1/5 to 1: 0.2, 0.299, 0.447, 0.669, 1. At FPR 0.2 one negative may pass,
    # so the threshold stays below 0.25 and only the 0.2 positive is accepted (TPR 0.5); from
    # FPR 0.4 on, two negatives may pass (threshold below 0.5) and both positives are accepted.
    np.testing.assert_allclose(roc["fpr"], np.geomspace(0.2, 1.0, 5))
    assert roc["tpr"].tolist() == [0.5, 0.5, 1.0, 1.0, 1.0]
    assert roc["marks"] == {}  # 1e-4 .. 1e-2 are below what 5 negatives can resolve
