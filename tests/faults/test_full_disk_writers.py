"""Writers on a full disk (issue 37): a failed write of log.txt, metrics.json or the tensorboard
file stops the run with one line naming the file, the free space and what is not in it, before
that step's checkpoint (the last one stays intact), and leaves no half record in the file. A
console redirected to a full disk only warns, once. Real writes under a real RLIMIT_FSIZE."""
import glob
import json
import os
import resource
import subprocess
import sys

import pytest
import torch

from tests.e2e.test_train_net import RUN_FAILURE, _assert_one_line_error
from tests.faults import _full_disk_job as job
from tests.faults._jobs import job_args, job_env

LIMIT = 64 << 10  # the loops' files (2 KB checkpoints, short logs) stay well below it
WHAT = {"log": "the log", "metrics": "metrics to", "tensorboard": "tensorboard events to"}
LOST = {"log": "(its lines from ", "metrics": "(the records of iteration 7 are not in it)",
        "tensorboard": "(the records of iteration 7 are not in it)"}


def _limited(limit):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    """Every case's loop, in one process (the console case last: it fills this process's stdout)."""
    root = tmp_path_factory.mktemp("full_disk")
    results, stdout = root / "results.jsonl", root / "stdout.txt"
    with open(stdout, "ab") as out:  # appended to, like a shell's >>, so the filler lands at its end
        proc = subprocess.run([sys.executable, job.__file__, "loops", str(root), str(results), *WHAT, "console"],
                              env=job_env(), stdout=out, stderr=subprocess.PIPE, text=True,
                              preexec_fn=_limited(LIMIT), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Logging error" not in proc.stderr, proc.stderr[-3000:]
    by_case = {r["case"]: r for r in map(json.loads, results.read_text().splitlines())}
    return root, by_case, proc.stderr, stdout


def _assert_last_checkpoint(out, name):
    assert (out / "last_checkpoint").read_text() == name
    assert "model" in torch.load(out / name, map_location="cpu", weights_only=True)
    assert not glob.glob(str(out / "*.tmp")) and not glob.glob(str(out / ".*.tmp"))


@pytest.mark.slow
@pytest.mark.parametrize("case", [*WHAT, "console"])
def test_full_disk_writer(loops, case):
    root, results, stderr, stdout = loops
    out, result = root / case, results[case]
    if case == "console":  # the run goes on: one warning, and the log file has the lines the console lost
        warnings = [line for line in stderr.splitlines() if line.strip()]
        assert warnings == [warnings[0]] and warnings[0].startswith(
            f"warning: cannot write the console output to {stdout}: File too large (EFBIG); "), stderr
        assert result == {"case": "console", "error": None, "iter": job.MAX_ITER}
        assert "iter: 11" in (out / "log.txt").read_text()
        _assert_last_checkpoint(out, "model_final.pth")
        return
    target = glob.glob(str(out / job.TARGETS[case]))[0]
    error = result["error"]
    assert error.startswith(f"cannot write {WHAT[case]} {target}: File too large (EFBIG); "), error
    for needle in (" free there now: ", "ulimit -f", "then continue with --resume", LOST[case]):
        assert needle in error, error
    # Stopped at the first write after the fill, before that step's checkpoint.
    assert result["iter"] == job.PERIOD * 2 - 1 and "\n" not in error
    _assert_last_checkpoint(out, "model_0000003.pth")
    assert not (out / "model_0000007.pth").exists()
    # The record that got part-way was cut back: the file ends with the filler.
    assert os.path.getsize(target) == LIMIT - job.SHORT and open(target, "rb").read().endswith(b"#\n")
    if case == "metrics":
        assert json.loads(open(target).readline())["iteration"] == 3


@pytest.mark.slow
def test_reid_train_log_on_a_full_disk(data_root, tmp_path):
    """The real command: log.txt fills after the first checkpoint; one error line, exit 1, that
    checkpoint kept as the one to resume from."""
    out = tmp_path / "out"
    limit = 4 << 20  # above the 2 MB checkpoints
    env = job_env(REID_TEST_FILL_AT=f"10:{out / 'log.txt'}")
    proc = subprocess.run([sys.executable, job.__file__, "train", *job_args(data_root, out)], env=env,
                          preexec_fn=_limited(limit), capture_output=True, text=True, timeout=240)
    _assert_one_line_error(proc, RUN_FAILURE, f"cannot write the log {out / 'log.txt'}: File too large (EFBIG)",
                           " free there now: ", "ulimit -f", "--resume", "(its lines from ")
    assert "Logging error" not in proc.stderr
    _assert_last_checkpoint(out, "model_0000008.pth")
    assert not (out / "model_0000017.pth").exists() and not (out / "model_final.pth").exists()
    assert os.path.getsize(out / "log.txt") == limit - job.SHORT
