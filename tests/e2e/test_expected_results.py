"""A run whose results miss TEST.EXPECTED_RESULTS exits non-zero and says which metric missed."""
import os

import pytest

from tests.conftest import run_cli

from .test_train_net import tiny_args

# Real command lines in fresh interpreters: seconds each, so the whole module is in the slow tier.
pytestmark = pytest.mark.slow


def test_missed_expectation_exits_non_zero_and_keeps_the_run(data_root, tmp_path):
    out = tmp_path / "out"
    expected = "[['SyntheticReIDTiny', 'mAP', 101.0, 0.5], ['SyntheticReIDTiny', 'Rank-1', 0.0, 100.0]]"
    proc = run_cli(tiny_args(data_root, out, "SOLVER.MAX_EPOCH", "1", "TEST.EVAL_PERIOD", "1",
                             "TEST.EXPECTED_RESULTS", expected))
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    # the missed metric, its value, by how much it missed and the tolerance; the met one is not named
    assert "TEST.EXPECTED_RESULTS not met: SyntheticReIDTiny mAP = " in errors[0]
    assert "expected 101.0000 +- 0.5000 (off by " in errors[0]
    assert "Rank-1" not in errors[0]
    assert "Traceback" not in proc.stderr
    # the run itself is kept: the final checkpoint was written before the check
    assert os.path.exists(out / "model_final.pth")


def test_eval_only_checks_expected_results_too(vis_run, data_root, tmp_path):
    weights = os.path.join(vis_run[0], "model_final.pth")  # a one-epoch run's final weights
    met = run_cli(["--eval-only"] + tiny_args(data_root, tmp_path / "eval_ok", "MODEL.WEIGHTS", weights,
                                              "TEST.EXPECTED_RESULTS", "[['SyntheticReIDTiny', 'mAP', 50.0, 50.0]]"))
    assert met.returncode == 0, met.stderr[-2000:]
    missed = run_cli(["--eval-only"] + tiny_args(data_root, tmp_path / "eval_missed", "MODEL.WEIGHTS", weights,
                                                 "TEST.EXPECTED_RESULTS", "[['SyntheticReIDTiny', 'mINP', -5.0, 0.1]]"))
    assert missed.returncode == 1
    assert "SyntheticReIDTiny mINP = " in missed.stderr and "expected -5.0000 +- 0.1000" in missed.stderr
