"""Writers on a full disk, under a real file size limit (RLIMIT_FSIZE, set by the test).

    python _full_disk_job.py loops OUT_ROOT RESULTS CASE...   the real engine loop, once per case
    python _full_disk_job.py train TRAIN_NET_ARGS...          reid-train; REID_TEST_FILL_AT=ITER:PATH

At the start of an iteration a file is filled to SHORT bytes below the size limit
(``fill_to_limit``), so that its next write, and only that file's, fails with EFBIG after
writing part of its record (SIGXFSZ is ignored, as the run set-up does).

``loops`` runs, per case, a small trainer with the hooks of a real run in their real order
(the PeriodicWriter with the default writers, then the PeriodicCheckpointer) and appends
``{"case", "error", "iter"}`` to RESULTS (JSON lines). The ``console`` case fills this
process's stdout, so it must come last.
"""
import glob
import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch.nn as nn  # noqa: E402

from reid_engine.engine import hooks  # noqa: E402
from reid_engine.engine.setup import default_writers  # noqa: E402
from reid_engine.engine.train_loop import SimpleTrainer  # noqa: E402
from reid_engine.engine.trainer_base import TrainerBase  # noqa: E402
from reid_engine.utils.checkpoint import Checkpointer  # noqa: E402
from reid_engine.utils.errors import ReidUserError  # noqa: E402
from reid_engine.utils.file_io import ignore_file_size_signal  # noqa: E402
from reid_engine.utils.logger import setup_logger  # noqa: E402

#: the loops: writes and checkpoints after iterations 3, 7, 11; the file fills at the start of 5
MAX_ITER, PERIOD, FILL_AT = 12, 4, 5
#: how far below the limit a file is filled: the next record gets that far, then fails
SHORT = 10
#: the file each case fills (in the case's output folder)
TARGETS = {"log": "log.txt", "metrics": "metrics.json", "tensorboard": "events.out.tfevents.*", "console": None}


def fill_to_limit(path):
    """Append filler lines to `path` until it is SHORT bytes below the soft file size limit."""
    missing = resource.getrlimit(resource.RLIMIT_FSIZE)[0] - SHORT - os.path.getsize(path)
    if missing > 0:
        with open(path, "ab") as f:
            f.write(b"#" * (missing - 1) + b"\n")


def _target(out, case):
    if TARGETS[case] is None:
        sys.stdout.flush()
        return os.readlink("/proc/self/fd/1")
    return glob.glob(os.path.join(out, TARGETS[case]))[0]


class _Loop(TrainerBase):
    """Scalars and a log line per step; fills the case's file at FILL_AT."""

    def __init__(self, out, case):
        super().__init__()
        self._out, self._case = out, case
        checkpointer = Checkpointer(nn.Linear(4, 2), out)
        self.register_hooks([hooks.PeriodicWriter(default_writers(out, MAX_ITER), period=PERIOD),
                             hooks.PeriodicCheckpointer(checkpointer, PERIOD, max_iter=MAX_ITER)])

    def run_step(self):
        if self.iter == FILL_AT:
            fill_to_limit(_target(self._out, self._case))
        self.storage.put_scalars(total_loss=1.0 / (self.iter + 1), time=0.01)


def run_loops(out_root, results, cases):
    """Run each case's loop; record its one-line error (or none) and the iteration it stopped at."""
    for case in cases:
        out = os.path.join(out_root, case)
        setup_logger(out, color=False)
        loop = _Loop(out, case)
        error = None
        try:
            loop.train(0, MAX_ITER)
        except ReidUserError as e:
            error = str(e)
        with open(results, "a") as f:
            f.write(json.dumps({"case": case, "error": error, "iter": loop.iter}) + "\n")


def _filling_run_step(self):
    iteration, path = os.environ["REID_TEST_FILL_AT"].split(":", 1)
    if self.iter == int(iteration):
        fill_to_limit(path)
    _run_step(self)


_run_step = SimpleTrainer.run_step

if __name__ == "__main__":
    ignore_file_size_signal()
    if sys.argv[1] == "loops":
        run_loops(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        from reid_engine.cli.train import main

        SimpleTrainer.run_step = _filling_run_step
        sys.exit(main(sys.argv[2:]))
