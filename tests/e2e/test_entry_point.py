"""The `reid-train` console script is the same command as tools/train_net.py."""
from importlib.metadata import entry_points

import pytest

from reid_engine.engine import cli
from tests.conftest import run_cli


def test_reid_train_entry_point_targets_the_cli():
    found = [ep for ep in entry_points(group="console_scripts") if ep.name == "reid-train"]
    if not found:
        pytest.skip("reid_engine is not pip-installed here (pip install -e . declares reid-train)")
    assert found[0].load() is cli.console_main


def test_help_lists_every_flag():
    proc = run_cli(["--help"])
    assert proc.returncode == 0
    for flag in ["--config-file", "--resume", "--eval-only", "--num-gpus", "--num-machines", "--machine-rank",
                 "--dist-url"]:
        assert flag in proc.stdout
