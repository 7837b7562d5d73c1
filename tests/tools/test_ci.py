""".ci/unchanged_env, CI's check that the tests leave the installed packages as they found them, with
a stand-in `pip` (its "installed packages" are the lines of a file) instead of a real environment."""
import os
import stat
import subprocess

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, ".ci", "unchanged_env")
# `pip install [--options] A B`: adds "A==1" and "B==1" (once each); `pip freeze`: prints them.
FAKE_PIP = """#!/bin/sh
case "$1" in
  freeze) cat "$PACKAGES" ;;
  install) shift; for name in "$@"; do
    case "$name" in -*) continue;; esac
    grep -qx "$name==1" "$PACKAGES" || echo "$name==1" >> "$PACKAGES"
  done ;;
esac
"""


@pytest.fixture
def run(tmp_path):
    """Run the script on a command with the stand-in pip first on PATH; (exit status, output)."""
    (tmp_path / "bin").mkdir()
    pip = tmp_path / "bin" / "pip"
    pip.write_text(FAKE_PIP)
    pip.chmod(pip.stat().st_mode | stat.S_IEXEC)
    packages = tmp_path / "packages"
    packages.write_text("numpy==2\n")
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", PACKAGES=str(packages))

    def call(command):
        proc = subprocess.run([SCRIPT, command], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
        return proc.returncode, proc.stdout + proc.stderr
    return call


def test_the_install_runs_before_the_first_freeze_and_the_tests_status_is_kept(run):
    # boxmot is new here: had the script not installed it before the "before" freeze, the check would fail
    status, out = run("pip install boxmot && echo the tests ran")
    assert status == 0 and "the tests ran" in out and "pip freeze unchanged" in out, out
    status, out = run("pip install boxmot && pip install --no-deps motmetrics && (exit 3)")
    assert status == 3 and "pip freeze unchanged by the tests (3 lines)" in out, out


def test_a_package_the_tests_install_fails_the_run_with_the_diff(run):
    status, out = run("pip install boxmot && true; pip install onnxruntime")
    assert status == 1, out
    assert "+onnxruntime==1" in out and "the tests changed the installed packages" in out, out


def test_a_command_without_its_install_is_refused(run):
    status, out = run("python -m pytest tests")
    assert status == 2 and "does not start with its install" in out, out
