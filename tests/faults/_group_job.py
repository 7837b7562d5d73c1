"""A training job that is the leader of its own process group, to signal it the way a terminal's Ctrl-C
or a batch scheduler's cancel does: every process of the job (loader workers, DDP workers, the launcher)
gets the signal (test_preemption)."""
import os
import re
import signal
import subprocess
import sys
import time

import torch

from reid_engine.reliability.preemption import PREEMPTED_EXIT_CODE
from tests.conftest import REPO_ROOT
from tests.faults._jobs import JOB, MAX_ITER, error_lines, job_env, read, wait_for

#: the target of issue 37: from a signal to the process group to the checkpoint saved at the stop
STOP_WITHIN_S = 10.0


class GroupJob:
    """`_train_job.py args` in a new process group, its output in files; slow steps (until the stop
    request) leave time to signal it mid-run, at iteration 3 (`signal_when_training`)."""

    def __init__(self, out, args, signum):
        self.out, self.signum = out, signum
        os.makedirs(out)
        self.stderr_path = os.path.join(out, "stderr.txt")
        with open(os.path.join(out, "stdout.txt"), "w") as stdout, open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen([sys.executable, JOB] + list(args), env=job_env(REID_TEST_STEP_DELAY=0.3),
                                         cwd=REPO_ROOT, stdout=stdout, stderr=stderr, start_new_session=True)
        self.sent = self.ended = None

    def poll(self):
        """Signal the group once the log shows iteration 3 (the loader workers have delivered batches, so
        they run); note when the job ended. Returns whether it has ended."""
        if self.sent is None and self.proc.poll() is not None:  # ended on its own: fails the checks
            self.sent = time.time()
        if self.sent is None and "iter: 3 " in read(os.path.join(self.out, "log.txt")):
            os.killpg(self.proc.pid, self.signum)
            self.sent = time.time()
        if self.sent is not None and self.ended is None and self.proc.poll() is not None:
            self.ended = time.time()
        return self.ended is not None

    def signal_when_training(self, timeout=300):
        """Signal the group at iteration 3 and wait for the job to end (killed at the timeout)."""
        try:
            wait_for(self.poll, timeout=timeout, what=f"the job in {self.out} to stop")
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def check_stopped_with_checkpoint(self, loader_workers):
        """Exit 143 and one error line naming the checkpoint saved at the stop, within STOP_WITHIN_S of the
        signal, and the resume command; `loader_workers` per process ran. Returns (iteration, command)."""
        err = read(self.stderr_path)
        assert self.proc.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
        assert f"{loader_workers} loader workers," in read(os.path.join(self.out, "log.txt"))
        assert "Traceback" not in err and len(error_lines(err)) == 1, err[-3000:]
        match = re.search(rf"training stopped by {signal.Signals(self.signum).name} after iteration (\d+): checkpoint "
                          r"(\S+) saved; continue with (python tools/train_net.py .*--resume.*)$", error_lines(err)[0])
        assert match, error_lines(err)
        iteration = int(match.group(1))
        assert 3 <= iteration < MAX_ITER - 1
        checkpoint = os.path.join(self.out, f"model_{iteration:07d}.pth")
        assert match.group(2) == checkpoint
        assert read(os.path.join(self.out, "last_checkpoint")).strip() == os.path.basename(checkpoint)
        assert torch.load(checkpoint, weights_only=True)["iteration"] == iteration
        saved_after = os.path.getmtime(checkpoint) - self.sent
        assert saved_after < STOP_WITHIN_S, f"the checkpoint came {saved_after:.1f} s after the signal"
        return iteration, match.group(3)
