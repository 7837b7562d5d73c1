"""The console scripts of setup.py resolve to the command modules, and each answers --help."""
import importlib
import os
import re

import pytest

from reid_engine.cli import data, export, extract, index, make_synthetic, train, tune, visualize
from tests.conftest import REPO_ROOT, run_cli

COMMANDS = {
    "reid-train": train,
    "reid-extract": extract,
    "reid-export": export,
    "reid-visualize": visualize,
    "reid-make-synthetic": make_synthetic,
    "reid-data": data,
    "reid-tune": tune,
    "reid-index": index,
}


def declared_console_scripts():
    """{name: "module:function"} as setup.py declares them."""
    with open(os.path.join(REPO_ROOT, "setup.py"), encoding="utf-8") as f:
        return dict(re.findall(r'"(reid-[\w-]+)=([\w.]+:\w+)"', f.read()))


def test_every_command_is_a_console_script_targeting_its_main():
    declared = declared_console_scripts()
    assert sorted(declared) == sorted(COMMANDS)
    for name, target in declared.items():
        module_name, func = target.split(":")
        target_func = getattr(importlib.import_module(module_name), func)
        assert target_func is COMMANDS[name].main, name
        assert COMMANDS[name].PROG == name  # error lines start with the console script's name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_exits_0_and_names_the_command(name, capsys):
    assert COMMANDS[name].main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {name} ") and "--debug" in out


@pytest.mark.slow
def test_train_help_lists_every_flag():
    proc = run_cli(["--help"])  # tools/train_net.py, as the README shows it
    assert proc.returncode == 0
    for flag in ["--config-file", "--resume", "--eval-only", "--num-gpus", "--num-machines", "--machine-rank",
                 "--dist-url", "--debug"]:
        assert flag in proc.stdout
