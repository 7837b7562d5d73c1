"""`reid-train --num-gpus 2 --eval-only` on two CPU workers (gloo), recording which process builds
and checks the config (run as a script).

    python _train_job.py OUT_DIR

This module's top level runs in the launching process and again, as ``__mp_main__``, in every
spawned worker, so the counters it installs see the config built or checked in any of them. Each
call appends ``<pid> <what>`` to OUT_DIR/calls.txt. The workers' evaluation is replaced by a record
of the config they were handed (``<pid> worker <type> frozen=<bool> rank=<rank>``).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from reid_engine.cli import train  # noqa: E402
from reid_engine.engine import setup as engine_setup  # noqa: E402
from reid_engine.utils import comm  # noqa: E402

OUT_DIR = sys.argv[1]  # multiprocessing's spawn gives the workers the launcher's sys.argv too


def _record(what):
    with open(os.path.join(OUT_DIR, "calls.txt"), "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()} {what}\n")


def _counted(what, func):
    def counting(*args, **kwargs):
        _record(what)
        return func(*args, **kwargs)
    return counting


def _received(cfg):
    """Stands in for the evaluation: what the worker was handed."""
    _record(f"worker {type(cfg).__name__} frozen={cfg.is_frozen()} rank={comm.get_rank()}")
    return {}


train.build_config = _counted("build_config", train.build_config)
train.check_config_values = _counted("check_config_values", train.check_config_values)
engine_setup.check_config_values = _counted("check_config_values", engine_setup.check_config_values)
train._eval_only = _received

if __name__ == "__main__":
    _record("launcher")
    sys.exit(train.main(["--num-gpus", "2", "--dist-url", "auto", "--eval-only",
                         "MODEL.DEVICE", "cpu", "OUTPUT_DIR", OUT_DIR]))
