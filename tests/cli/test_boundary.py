"""The one error boundary: one `error:` line, exit 2 for usage errors and 1 for run failures."""
import sys
import traceback

import pytest
import torch.multiprocessing as mp

from reid_engine.cli import export, make_synthetic, train, visualize
from reid_engine.cli.boundary import run_command
from reid_engine.cli.train import build_parser
from reid_engine.config import ConfigError


def _one_error_line(err, prog, *needles, traceback_shown=False):
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines, err
    assert [line for line in lines if f"{prog}: error:" in line] == [lines[-1]], err
    for needle in needles:
        assert needle in lines[-1], lines[-1]
    assert ("Traceback" in err) == traceback_shown, err
    if not traceback_shown:
        assert len(lines) == 1, err


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch):
    monkeypatch.delenv("REID_DEBUG", raising=False)


def test_config_error_is_one_line_with_exit_code_2(capsys):
    assert train.main(["SOLVER.BASE_LRR", "0.1"]) == 2
    _one_error_line(capsys.readouterr().err, "reid-train", "SOLVER.BASE_LRR", "SOLVER.BASE_LR")


def test_missing_weights_file_is_a_run_failure_with_exit_code_1(tmp_path, capsys):
    missing = str(tmp_path / "nope.pth")
    assert export.main(["--output", str(tmp_path / "out"), "MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", missing]) == 1
    _one_error_line(capsys.readouterr().err, "reid-export", missing)


def test_debug_flag_and_env_show_the_traceback(tmp_path, capsys, monkeypatch):
    assert train.main(["--debug", "SOLVER.BASE_LRR", "0.1"]) == 2
    _one_error_line(capsys.readouterr().err, "reid-train", "SOLVER.BASE_LRR", traceback_shown=True)
    monkeypatch.setenv("REID_DEBUG", "1")
    assert train.main(["SOLVER.BASE_LRR", "0.1"]) == 2
    _one_error_line(capsys.readouterr().err, "reid-train", "SOLVER.BASE_LRR", traceback_shown=True)
    monkeypatch.setenv("REID_DEBUG", "0")  # "0" means off
    assert train.main(["SOLVER.BASE_LRR", "0.1"]) == 2
    _one_error_line(capsys.readouterr().err, "reid-train", "SOLVER.BASE_LRR")


def _worker_exception(error: BaseException) -> mp.ProcessRaisedException:
    """What torch.multiprocessing raises in the parent when a spawned worker raised `error`."""
    try:
        raise error
    except BaseException:
        text = traceback.format_exc()
    return mp.ProcessRaisedException(f"\n\n-- Process 1 terminated with the following error:\n{text}", 1, 4242)


def _raising(error):
    def body(args):
        raise error
    return body


def test_user_error_in_a_worker_is_one_line(capsys):
    worker_error = _worker_exception(ConfigError("unknown key (MODEL.FOO): did you mean MODEL.META_ARCHITECTURE?"))
    assert run_command("reid-train", build_parser(), _raising(worker_error), []) == 2
    _one_error_line(capsys.readouterr().err, "reid-train", "unknown key (MODEL.FOO): did you mean")
    assert run_command("reid-train", build_parser(), _raising(worker_error), ["--debug"]) == 2
    _one_error_line(capsys.readouterr().err, "reid-train", "MODEL.FOO", traceback_shown=True)


def test_bug_keeps_its_traceback_and_a_summary_line(capsys):
    assert run_command("reid-train", build_parser(), _raising(ZeroDivisionError("oops")), []) == 1
    _one_error_line(capsys.readouterr().err, "reid-train", "ZeroDivisionError: oops", traceback_shown=True)
    worker_bug = _worker_exception(KeyError("internal"))
    assert run_command("reid-train", build_parser(), _raising(worker_bug), []) == 1
    _one_error_line(capsys.readouterr().err, "reid-train", "KeyError", traceback_shown=True)


def test_invalid_synthetic_settings_are_a_usage_error(capsys):
    assert make_synthetic.main(["--no-write", "--cameras", "1"]) == 2
    _one_error_line(capsys.readouterr().err, "reid-make-synthetic", "num_cameras")


@pytest.mark.slow
def test_missing_matplotlib_is_one_clear_line(monkeypatch, tmp_path, capsys, tiny_config_file):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    assert visualize.main(["--config-file", tiny_config_file, "--output", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("reid-visualize: error: rank-list visualization needs matplotlib, which is not installed: "
                   "pip install matplotlib")
