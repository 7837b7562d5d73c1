"""`tools/train_net.py` with test-only fault injection, set through the environment.

    python _train_job.py train_net args...            (also as torchrun's script)

- REID_TEST_STEP_DELAY=S: every step waits S seconds more, until a stop signal arrives (a slow run
  to signal from outside, which then ends without waiting);
- REID_TEST_SIGNAL_AT=RANK:ITER:SIGNAL: the worker of that rank sends SIGNAL (a name, e.g.
  SIGUSR1 or SIGKILL) to itself at the start of iteration ITER; under torchrun only in the
  first attempt (TORCHELASTIC_RESTART_COUNT 0), so the restarted group runs clean.

The patches are made at import, so they also apply in worker processes started with
spawn, which import this script again as ``__mp_main__``.
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from reid_engine.engine.train_loop import SimpleTrainer  # noqa: E402
from reid_engine.reliability import preemption  # noqa: E402
from reid_engine.utils import comm  # noqa: E402

_run_step = SimpleTrainer.run_step
_delay = float(os.environ.get("REID_TEST_STEP_DELAY", "0"))
_signal_at = os.environ.get("REID_TEST_SIGNAL_AT", "")


def _faulty_run_step(self):
    if _signal_at and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        rank, iteration, name = _signal_at.split(":")
        if comm.get_rank() == int(rank) and self.iter == int(iteration):
            os.kill(os.getpid(), getattr(signal, name))
    _run_step(self)
    deadline = time.monotonic() + _delay
    while time.monotonic() < deadline and not preemption.requested_signal():  # a stop request ends the wait
        time.sleep(0.02)


SimpleTrainer.run_step = _faulty_run_step

if __name__ == "__main__":
    from reid_engine.cli.train import main

    sys.exit(main(sys.argv[1:]))
