"""An OUTPUT_DIR that cannot be written: one line before the model is built, exit 1,
nothing in the way changed."""
import os

import pytest

from reid_engine.utils.file_io import FileWriteError, check_writable_dir, ensure_writable_dir
from tests.conftest import run_cli
from tests.e2e.test_train_net import RUN_FAILURE, _assert_one_line_error, tiny_args

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def test_a_file_in_the_way(tmp_path):
    blocker = tmp_path / "runs"
    blocker.write_text("not a folder")
    for target in (blocker, blocker / "deeper" / "out"):
        for check in (check_writable_dir, ensure_writable_dir):
            with pytest.raises(FileWriteError, match=f"OUTPUT_DIR '{target}' cannot be a folder: '{blocker}' is a file"):
                check(str(target), "OUTPUT_DIR")
    assert blocker.read_text() == "not a folder"


@pytest.mark.skipif(IS_ROOT, reason="root writes into read-only folders")
def test_a_read_only_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        for check in (check_writable_dir, ensure_writable_dir):
            with pytest.raises(FileWriteError, match=f"OUTPUT_DIR '{locked / 'out'}' is not writable"):
                check(str(locked / "out"), "OUTPUT_DIR")
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o755)


def test_ensure_creates_and_leaves_no_probe(tmp_path):
    target = tmp_path / "a" / "b"
    ensure_writable_dir(str(target), "OUTPUT_DIR")
    assert target.is_dir() and os.listdir(target) == []


@pytest.mark.slow
def test_cli_file_in_the_way_fails_before_anything_is_built(data_root, tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("keep me")
    proc = run_cli(tiny_args(data_root, blocker / "run"))
    _assert_one_line_error(proc, RUN_FAILURE, "OUTPUT_DIR", f"'{blocker}' is a file")
    assert "Prepare training set" not in proc.stdout and "model" not in proc.stdout.lower(), proc.stdout[-2000:]
    assert blocker.read_text() == "keep me"


def test_unwritable_folder_fails_before_the_model_is_built(data_root, tmp_path, capsys):
    """In-process `reid-train` (the subprocess path is the test above): the check of the
    parent passes (root, or sysfs that looks writable) and the worker's set-up catches it."""
    from reid_engine.cli.train import main

    if IS_ROOT:  # root ignores permission bits; sysfs refuses new folders even to root
        target = "/sys/reid_engine_test_output"
        if os.path.exists(target) or not os.path.isdir("/sys"):
            pytest.skip("no unwritable folder to test with")
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        target = str(locked / "out")
    assert main(tiny_args(data_root, target)) == RUN_FAILURE
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"reid-train: error: OUTPUT_DIR '{target}' is not writable")
    assert "Prepare training set" not in captured.out
    assert not os.path.exists(target)
