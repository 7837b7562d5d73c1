"""What the real-process continuation tests share: the tiny 4-epoch base config they tune (a checkpoint
after each epoch, evaluations after epochs 2 and 4) and the weights of its first trial (the base config
itself) trained once, uninterrupted, by reid-train: the weights a continued trial must end with."""
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO_ROOT

CFG = os.path.join(REPO_ROOT, "tests", "e2e", "configs", "tiny_R18.yml")
SPACE = """
objective: {metric: SyntheticReIDTiny/mAP, direction: maximize}
pruner: none
params:
  SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}
"""
BASE_LR = 0.00035  # the base config's: the study's first trial


def continued_opts(data_root, out):
    """Quarter-width R18 at 32x16: 4 epochs of 9 iterations, a checkpoint after each, evaluations after 2 and 4."""
    return ["DATASETS.ROOT", data_root, "OUTPUT_DIR", str(out), "MODEL.BACKBONE.WIDTH_MULT", "0.25",
            "INPUT.SIZE_TRAIN", "[32, 16]", "INPUT.SIZE_TEST", "[32, 16]", "SOLVER.MAX_EPOCH", "4",
            "TEST.EVAL_PERIOD", "2", "SOLVER.CHECKPOINT_PERIOD", "1"]


def weights(path):
    """The model weights of a checkpoint file."""
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


@pytest.fixture(scope="session")
def uninterrupted_first_trial(data_root, tmp_path_factory):
    """model_final.pth's weights of the study's first trial (BASE_LR, SEED 0) trained without a stop by
    reid-train, in a fresh interpreter on one thread like the tune workers."""
    out = tmp_path_factory.mktemp("uninterrupted")
    subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tools", "train_net.py"), "--config-file", CFG,
                    *continued_opts(data_root, out), "SOLVER.BASE_LR", repr(BASE_LR), "SEED", "0"],
                   cwd=REPO_ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return weights(out / "model_final.pth")


def assert_same_weights(got, want):
    """Bit-identical weights, key by key."""
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
