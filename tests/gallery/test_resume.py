"""A build stopped by SIGTERM, then killed, leaves the previous index intact and continues where it stopped."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from reid_engine.cli import index as index_cli
from reid_engine.gallery import Location, open_index
from tests.conftest import REPO_ROOT


def _start(args):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "tools", "index.py")] + args, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_chunks(staging, count, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.isdir(staging) and sum(n.endswith(".npy") for n in os.listdir(staging)) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {count} chunks in {staging}: {proc.communicate()[1][-2000:]}")


@pytest.mark.slow
def test_sigterm_and_kill_keep_the_old_index_and_resume(tmp_path, tiny_config_file, data_root):
    from reid_engine.data.datasets import get_dataset

    gallery = get_dataset("SyntheticReIDTiny", data_root).gallery
    path = str(tmp_path / "g.rindex")
    model = ["--config-file", tiny_config_file]
    small = tmp_path / "old.csv"
    small.write_text("path,camid\n" + "".join(f"{p},{c}\n" for p, _, c in gallery[:8]))
    # the previous index in-process (only the interrupted builds need a process of their own)
    assert index_cli.main(["build", "--index", path, "--list", str(small)] + model) == 0
    with open(path, "rb") as f:
        previous = f.read()
    job = ["build", "--index", path, "--split", "gallery", "--chunk-size", "8"] + model
    staging = path + ".partial"

    proc = _start(job)
    _wait_for_chunks(staging, 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("reid-index: error: stopped by SIGTERM")
    with open(path, "rb") as f:
        assert f.read() == previous  # the previous index is intact
    kept = sorted(os.listdir(staging))

    proc = _start(job)
    _wait_for_chunks(staging, len([k for k in kept if k.endswith(".npy")]) + 1, proc)
    proc.kill()
    proc.communicate(timeout=60)
    with open(path, "rb") as f:
        assert f.read() == previous

    proc = _start(job)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    assert "Resuming:" in out + err
    index = open_index(Location(path))
    assert len(index) == len(gallery) and not os.path.exists(staging)
    assert list(index.records(np.arange(len(gallery))).path) == [p for p, _, _ in gallery]
