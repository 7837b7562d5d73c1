"""Runs shared by the end-to-end modules."""
import os

import pytest

from tests.conftest import run_cli
from tests.e2e.test_train_net import tiny_args


@pytest.fixture(scope="session")
def vis_run(data_root, tmp_path_factory):
    """One short tiny run with TEST.RANK_VIS on (9 iterations, one evaluation at the end):
    (output folder, console text, log text). Its model_final.pth also serves the eval-only tests."""
    out = tmp_path_factory.mktemp("vis") / "out"
    # No periodic checkpoint (only final and best): the tests need none, and each costs disk.
    proc = run_cli(tiny_args(data_root, out, "SOLVER.MAX_EPOCH", "1", "TEST.EVAL_PERIOD", "5",
                             "TEST.RANK_VIS", "True", "SOLVER.CHECKPOINT_PERIOD", "10"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return str(out), proc.stdout + proc.stderr, open(os.path.join(out, "log.txt")).read()
