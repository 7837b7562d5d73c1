"""A checkpoint write that fails (disk full, quota, file size limit): one line naming the path
and the free space, exit 1; the previous checkpoint, last_checkpoint, metrics.json and log.txt
are intact and no partial file is left."""
import errno
import os
import re
import resource
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from reid_engine.utils import checkpoint as ckpt_module
from reid_engine.utils.checkpoint import Checkpointer
from reid_engine.utils.file_io import FileWriteError, WriteErrorRecorder
from tests.conftest import REPO_ROOT
from tests.e2e.test_train_net import RUN_FAILURE, _assert_kept, _assert_one_line_error, snapshot, tiny_args


def _previous_run(out):
    """An output folder as an earlier run left it: a checkpoint, its tag, metrics and a log."""
    torch.manual_seed(0)
    Checkpointer(nn.Linear(4, 2), str(out)).save("model_0000004", iteration=4)
    (out / "metrics.json").write_text('{"iteration": 4, "total_loss": 2.5}\n')
    (out / "log.txt").write_text("[11/25 00:00:00] reid_engine INFO: an earlier run\n")
    return snapshot(out)


def _leftovers(out):
    return [name for name in os.listdir(out) if name.endswith(".tmp")]


@pytest.mark.parametrize("code,words", [(errno.ENOSPC, "No space left on device (ENOSPC)"),
                                        (errno.EDQUOT, f"{os.strerror(errno.EDQUOT)} (EDQUOT)")])
def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch, code, words):
    out = tmp_path / "out"
    before = _previous_run(out)

    class FullDisk(WriteErrorRecorder):
        calls = 0

        def write(self, data):
            FullDisk.calls += 1
            if FullDisk.calls > 2:  # part of the file is on disk when the space runs out
                return self._recorded(self._raise)
            return super().write(data)

        def _raise(self):
            raise OSError(code, os.strerror(code))

    monkeypatch.setattr(ckpt_module, "WriteErrorRecorder", FullDisk)
    with pytest.raises(FileWriteError) as err:
        Checkpointer(nn.Linear(64, 64), str(out)).save("model_0000009", iteration=9)
    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 1
    assert f"cannot write checkpoint {out / 'model_0000009.pth'}: {words} after " in message
    assert re.search(r" after [0-9.]+ (B|KiB|MiB) of it; [0-9.]+ [KMG]?i?B free there now: ", message), message
    assert " free there now: " in message and "--resume" in message
    assert snapshot(out) == before and _leftovers(out) == []


@pytest.mark.slow
def test_cli_file_size_limit_mid_training(data_root, tmp_path):
    """The real command under RLIMIT_FSIZE: the first checkpoint of the run (8 MB) is over the
    limit; the write fails with EFBIG (SIGXFSZ is ignored, so the process is not killed)."""
    out = tmp_path / "out"
    before = _previous_run(out)
    limit = 1 << 20  # logs and metrics stay far below it

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # Two epochs, so the save that fails (end of epoch 1) is not the run's last step.
    args = tiny_args(data_root, out, "SOLVER.MAX_EPOCH", "2", "MODEL.BACKBONE.WIDTH_MULT", "0.25")
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tools", "train_net.py"), *args], env=env,
                          preexec_fn=limited, capture_output=True, text=True, timeout=240)
    target = out / "model_0000008.pth"
    _assert_one_line_error(proc, RUN_FAILURE, f"cannot write checkpoint {target}: File too large (EFBIG)",
                           "of it; ", " free there now: ", "ulimit -f")
    _assert_kept(before, out)
    assert not target.exists() and _leftovers(out) == []
    assert (out / "last_checkpoint").read_text() == "model_0000004.pth"
    assert "Starting training from iteration 0" in (out / "log.txt").read_text()  # the run did get going


def test_metrics_write_failure_is_one_line_and_keeps_earlier_lines(tmp_path):
    from reid_engine.integrations.event_writers import JSONWriter
    from reid_engine.utils.events import EventStorage

    path = tmp_path / "metrics.json"
    path.write_text('{"iteration": 4, "total_loss": 2.5}\n')
    writer = JSONWriter(str(path))
    real = writer._file_handle

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(real, name)

    writer._file_handle = FullDisk()
    with EventStorage(5) as storage:
        storage.put_scalar("total_loss", 1.5)
        with pytest.raises(FileWriteError) as err:
            writer.write()
    real.close()
    assert str(err.value).startswith(f"cannot write metrics to {path}: No space left on device (ENOSPC); ")
    assert " free there now: " in str(err.value)
    assert path.read_text() == '{"iteration": 4, "total_loss": 2.5}\n'
