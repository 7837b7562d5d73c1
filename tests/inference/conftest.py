"""Fixtures of the inference, export and command-line tests: a tiny model checkpoint and its config.

tests/export and tests/cli import them from here.
"""
import os

import pytest

from ._helpers import TINY_NUM_CLASSES, tiny_cfg


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, data_root):
    """A checkpoint of a freshly built tiny model (24 classes), saved with the Checkpointer."""
    import torch

    from reid_engine.modeling import build_model
    from reid_engine.utils.checkpoint import Checkpointer

    torch.manual_seed(0)
    cfg = tiny_cfg(data_root, extra=["MODEL.HEADS.NUM_CLASSES", TINY_NUM_CLASSES])
    model = build_model(cfg)
    folder = str(tmp_path_factory.mktemp("tiny_model"))
    Checkpointer(model, folder).save("model_final")
    return os.path.join(folder, "model_final.pth")


@pytest.fixture(scope="session")
def tiny_config_file(tmp_path_factory, data_root, tiny_checkpoint):
    """A YAML file of the tiny config with MODEL.WEIGHTS set, for the command-line tools."""
    path = str(tmp_path_factory.mktemp("tiny_cfg") / "tiny.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(tiny_cfg(data_root, tiny_checkpoint).dump())
    return path


@pytest.fixture(scope="session")
def tiny_predictor(data_root, tiny_checkpoint):
    """A DefaultPredictor of the tiny checkpoint (tests that change it must restore it)."""
    from reid_engine.inference import DefaultPredictor

    return DefaultPredictor(tiny_cfg(data_root, tiny_checkpoint))
