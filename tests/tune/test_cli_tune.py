"""The `reid-tune` command line: its flags, and the errors that stop it before any trial runs."""
import os
import re

import pytest

from reid_engine.cli import tune as tune_cli
from tests.conftest import REPO_ROOT

CFG = os.path.join(REPO_ROOT, "tests", "e2e", "configs", "tiny_R18.yml")
GOOD_SPACE = """
objective: {metric: SyntheticReIDTiny/mAP, direction: maximize}
params:
  SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}
"""


def error_lines(text):
    return [line for line in text.splitlines() if line.startswith("reid-tune: error:")]


def run_tune(tmp_path, space_text, *extra):
    space = tmp_path / "space.yml"
    space.write_text(space_text)
    return tune_cli.main(["--config-file", CFG, "--search-space", str(space), *extra,
                          "OUTPUT_DIR", str(tmp_path / "out")])


def test_parser_defaults_and_flags():
    args = tune_cli.build_parser().parse_args(["--config-file", CFG, "--search-space", "s.yml", "SOLVER.BASE_LR", "0.1"])
    assert (args.n_trials, args.storage, args.study_name, args.pruner, args.sampler_seed, args.heartbeat,
            args.summary, args.num_gpus) == (20, None, None, None, 0, 60.0, False, 1)
    assert args.opts == ["SOLVER.BASE_LR", "0.1"]
    assert tune_cli.study_name_of(args) == "s"
    args = tune_cli.build_parser().parse_args(["--search-space", "a/b.yml", "--study-name", "mine"])
    assert tune_cli.study_name_of(args) == "mine"


@pytest.mark.parametrize("space_text, extra, code, needles", [
    (GOOD_SPACE.replace("SOLVER.BASE_LR", "SOLVER.BASE_LRR"), (), 2, ["SOLVER.BASE_LRR"]),
    (GOOD_SPACE.replace("SyntheticReIDTiny/mAP", "Market1501/mAP"), (), 2, ["Market1501/mAP"]),
    ("objective: [1, 2]\nparams: {}\n", (), 2, ["objective"]),
    (GOOD_SPACE, ("--pruner", "sometimes"), 2, []),  # argparse's own usage error
    (GOOD_SPACE, ("--num-machines", "2"), 2, ["unrecognized arguments: --num-machines"]),  # not offered
    (GOOD_SPACE, ("--storage", "postgresql+psycopg://postgres:s3cret@127.0.0.1:55433x/db"), 2,
     ["cannot read the study storage URL postgresql+psycopg://postgres:***@127.0.0.1:55433x/db"]),
    (GOOD_SPACE, ("--storage", "postgresql+psycopg://me:s3cret@/x?host=/nonexistent-dir&port=1"), 1,
     ["cannot open the study storage postgresql+psycopg://me:***@/x?host=/nonexistent-dir&port=1"]),
    (GOOD_SPACE, ("SOLVER.BASE_LRR", "0.1"), 2, ["SOLVER.BASE_LRR"]),  # the base config itself
], ids=["unknown-key", "metric-of-no-test-set", "bad-objective", "unknown-pruner", "several-machines",
        "non-numeric-port", "unreachable-server", "bad-base-opt"])
def test_bad_input_is_one_error_line_before_any_trial(tmp_path, capsys, space_text, extra, code, needles):
    pytest.importorskip("optuna")
    assert run_tune(tmp_path, space_text, *extra) == code
    err = capsys.readouterr().err
    if needles:
        lines = error_lines(err)
        assert len(lines) == 1 and "Traceback" not in err, err
        assert all(n in lines[0] for n in needles) and "s3cret" not in err, lines[0]
    assert not (tmp_path / "out" / "space").exists()  # a rejected run leaves no study folder behind


def test_summary_of_a_study_that_does_not_exist(tmp_path, capsys):
    pytest.importorskip("optuna")
    assert run_tune(tmp_path, GOOD_SPACE, "--summary") == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "no study space" in line and "without --summary" in line
    assert not (tmp_path / "out").exists()


def test_missing_optuna_is_one_install_line(tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_optuna(name, *args, **kwargs):
        if name == "optuna" or name.startswith("optuna."):
            raise ImportError("No module named 'optuna'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    assert run_tune(tmp_path, GOOD_SPACE) == 1
    (line,) = error_lines(capsys.readouterr().err)
    assert line == "reid-tune: error: reid-tune needs Optuna: pip install 'reid_engine[tune]'"


def test_every_help_example_names_files_that_exist(capsys):
    assert tune_cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    files = re.findall(r"(?:configs|tools)/[\w/.]+\.(?:yml|py)", text)
    assert files and all(os.path.isfile(os.path.join(REPO_ROOT, f)) for f in files), files
    assert "--num-machines" not in text and "\\\\" not in text  # not offered; no doubled escape
