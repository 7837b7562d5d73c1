"""reid-extract and reid-visualize on tracklets: SyntheticVideoReIDTiny and a tiny VideoBaseline."""
import os

import numpy as np
import pytest

from reid_engine.cli import extract
from reid_engine.data.datasets import get_dataset
from reid_engine.data.tracklets import TrackletItemSet, representative_frame
from reid_engine.inference import DefaultPredictor, load_features

VIDEO_SET = "SyntheticVideoReIDTiny"


def video_opts(root: str, weights: str = ""):
    return ["MODEL.META_ARCHITECTURE", "VideoBaseline", "MODEL.DEVICE", "cpu", "MODEL.BACKBONE.DEPTH", "18x",
            "MODEL.BACKBONE.PRETRAIN", False, "MODEL.HEADS.NUM_CLASSES", 8, "INPUT.SIZE_TEST", [32, 16],
            "INPUT.SEQ_LEN", 2, "TEST.SAMPLE_METHOD", "evenly", "TEST.IMS_PER_BATCH", 4,
            "DATASETS.ROOT", root, "DATASETS.TESTS", (VIDEO_SET,), "DATALOADER.NUM_WORKERS", 0,
            "MODEL.WEIGHTS", weights]


@pytest.fixture(scope="module")
def video_setup(tmp_path_factory):
    """(data root, config file, predictor) of a freshly built tiny VideoBaseline on SyntheticVideoReIDTiny."""
    import torch

    from reid_engine.config import get_cfg
    from reid_engine.modeling import build_model
    from reid_engine.utils.checkpoint import Checkpointer

    root = str(tmp_path_factory.mktemp("video_data"))
    get_dataset(VIDEO_SET, root)
    cfg = get_cfg()
    cfg.merge_from_list(video_opts(root))
    torch.manual_seed(0)
    folder = str(tmp_path_factory.mktemp("video_model"))
    Checkpointer(build_model(cfg), folder).save("model_final")
    cfg.merge_from_list(["MODEL.WEIGHTS", os.path.join(folder, "model_final.pth")])
    config_file = os.path.join(folder, "video.yaml")
    with open(config_file, "w", encoding="utf-8") as f:
        f.write(cfg.dump())
    return root, config_file, DefaultPredictor(cfg)


def test_extract_embeds_each_tracklet_as_the_evaluation_does(video_setup, tmp_path):
    root, config_file, predictor = video_setup
    out = str(tmp_path / "gallery.npz")
    assert extract.main(["--config-file", config_file, "--split", "gallery", "--output", out]) == 0
    gallery = get_dataset(VIDEO_SET, root).gallery
    data = load_features(out)
    assert data["features"].shape == (len(gallery), 512) and data["source"] == f"{VIDEO_SET}/gallery"
    assert data["paths"] == [frames[0] for frames, _, _ in gallery]  # a tracklet is named by its first frame
    assert data["pids"].tolist() == [pid for _, pid, _ in gallery]
    # row i: the tracklet's frames as the test loader samples them, pooled by the model
    samples = TrackletItemSet(gallery, predictor.transforms, seq_len=2, method="evenly")
    for i in (0, len(gallery) - 1):
        expected = predictor.embed_batch(samples[i]["image"][None])[0].numpy()
        np.testing.assert_allclose(data["features"][i], expected, atol=1e-5)


def test_visualize_shows_the_middle_frame_of_each_tracklet(video_setup, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from reid_engine.inference import rank_figures
    from reid_engine.inference.rank_lists import visualize

    root, _, predictor = video_setup
    drawn, thumbnail = [], rank_figures.bordered_thumbnail
    monkeypatch.setattr(rank_figures, "bordered_thumbnail", lambda path, color: drawn.append(path) or thumbnail(path, color))
    written = visualize(predictor.cfg, str(tmp_path / "vis"), VIDEO_SET, query_indices=[0], worst=0, topk=3,
                        predictor=predictor)
    assert sorted(os.path.basename(p) for p in written) == ["distance_hist.png", "rank_q00000.png", "roc.png"]
    query = get_dataset(VIDEO_SET, root).query[0][0]
    assert len(drawn) == 4 and drawn[0] == query[(len(query) - 1) // 2]
    assert representative_frame(("a", "b", "c", "d")) == "b" and representative_frame("x.jpg") == "x.jpg"
