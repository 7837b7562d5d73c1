"""A few DefaultTrainer iterations on SyntheticVideoReIDTiny tracklets, then tracklet evaluation."""

import logging
import math
import os

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.slow
def test_video_training_runs_end_to_end(tmp_path):
    from reid_engine.config import get_cfg
    from reid_engine.engine.defaults import DefaultTrainer

    logging.getLogger("reid_engine").setLevel(logging.INFO)  # else DefaultTrainer sets up logging
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO_ROOT, "tests", "e2e", "configs", "tiny_R18.yml"))
    cfg.merge_from_list([
        "MODEL.META_ARCHITECTURE", "VideoBaseline", "MODEL.HEADS.TEMPORAL_POOL", "max",
        "DATASETS.ROOT", str(tmp_path / "data"), "DATASETS.NAMES", '("SyntheticVideoReIDTiny",)',
        "DATASETS.TESTS", '("SyntheticVideoReIDTiny",)', "INPUT.SEQ_LEN", 2, "INPUT.SAMPLE_METHOD", "random",
        "TEST.SAMPLE_METHOD", "all", "DATALOADER.NUM_INSTANCE", 2, "SOLVER.IMS_PER_BATCH", 8,
        "SOLVER.MAX_EPOCH", 1, "SOLVER.WARMUP_ITERS", 1, "TEST.EVAL_PERIOD", 1, "TEST.FLIP.ENABLED", True,
        "INPUT.SIZE_TRAIN", "[32, 16]", "INPUT.SIZE_TEST", "[32, 16]", "OUTPUT_DIR", str(tmp_path / "out")])
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    model_forward, shapes = trainer.model.forward, []

    def spy(batch):
        shapes.append((trainer.model.training, tuple(batch["images"].shape)))
        return model_forward(batch)

    trainer.model.forward = spy
    results = trainer.train()
    train_shapes = [s for training, s in shapes if training]
    assert trainer.max_iter == 16 // 8 == len(train_shapes)  # 16 training tracklets, 8 per batch
    assert all(s == (8, 2, 3, 32, 16) for s in train_shapes)
    test_shapes = [s for training, s in shapes if not training]
    assert len(test_shapes) == 2 * 12 and all(s[0] == 1 and s[1] >= 3 for s in test_shapes)  # flip: 2 calls each
    metrics = results["SyntheticVideoReIDTiny"]
    assert all(math.isfinite(v) for v in metrics.values()) and 0 <= metrics["mAP"] <= 100
