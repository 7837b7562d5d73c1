"""The read deadline's mechanism: results and errors pass through, the limit follows DATALOADER.HANG_TIMEOUT's
rule, and a process whose thread is left stuck in a read still exits (the thread is a daemon)."""
import os
import subprocess
import sys
import time

import pytest

from reid_engine.reliability import read_deadline
from reid_engine.reliability.read_deadline import ReadDeadline, hang_limit, iterate_with_deadline, map_with_deadline
from tests.conftest import REPO_ROOT

# A thread stuck opening a named pipe nobody writes; the error line, then the exit.
STUCK = """
import os, shutil, sys, tempfile
from reid_engine.reliability.read_deadline import ReadDeadline, ReadHangError, map_with_deadline, reading
pipe = os.path.join(tempfile.mkdtemp(), "pipe.jpg")
os.mkfifo(pipe)
def read(path):
    with reading(path):
        return open(path, "rb").read()
try:
    list(map_with_deadline(read, [pipe], 1, ReadDeadline(0.3, what="a test")))
except ReadHangError as exc:
    print(exc)
    for folder in (os.path.dirname(pipe), os.path.dirname(exc.stack_files[0])):  # left as found
        shutil.rmtree(folder)
    sys.exit(1)
"""


def test_results_and_errors_pass_through():
    assert sorted(map_with_deadline(lambda x: x * x, range(10), 3, ReadDeadline(5))) == [x * x for x in range(10)]
    assert list(iterate_with_deadline(iter(range(5)), ReadDeadline(5))) == list(range(5))

    def broken(x):
        raise ValueError(f"bad {x}")

    with pytest.raises(ValueError, match="bad"):
        list(map_with_deadline(broken, range(3), 2, ReadDeadline(5)))
    with pytest.raises(ValueError, match="bad 0"):
        list(iterate_with_deadline(map(broken, range(3)), ReadDeadline(5)))


def test_the_limit_is_the_loader_watchdogs_rule():
    assert hang_limit(3, 100.0) == 3.0
    assert hang_limit(0, 0.01) == read_deadline.HANG_TIMEOUT_FLOOR
    assert hang_limit(0, 7.5) == pytest.approx(read_deadline.HANG_TIMEOUT_FACTOR * 7.5)


def test_a_process_left_with_a_stuck_reader_thread_still_exits():
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT), cwd=REPO_ROOT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "a read for a test did not return within 0.3 s (DATALOADER.HANG_TIMEOUT 0.3 s): thread reader-0" in proc.stdout
    assert "pipe.jpg" in proc.stdout and time.monotonic() - start < 30
