"""Run tools/train_net.py, but SIGKILL the process in the middle of a checkpoint save.

The N-th time a `.pth` file is about to be renamed into place (its temporary file is
complete and fsynced, the rename has not happened), the process kills itself with
SIGKILL: the harshest moment for checkpoint atomicity. Used by the resume tests.

    python kill_during_save.py N train_net args...
"""
import os
import signal
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)


def main():
    kill_at = int(sys.argv[1])
    real_replace = os.replace
    seen = {"n": 0}

    def replace_then_maybe_die(src, dst, *args, **kwargs):
        if str(dst).endswith(".pth"):
            seen["n"] += 1
            if seen["n"] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst, *args, **kwargs)

    os.replace = replace_then_maybe_die
    from reid_engine.cli.train import main as train_main

    sys.exit(train_main(sys.argv[2:]))


if __name__ == "__main__":
    main()
