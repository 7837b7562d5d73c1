"""`tools/train_net.py` with test-only markers of long work, set through the environment, for the tests
that signal a run while it compiles or evaluates (test_stop_during_compile.py).

    python _stop_job.py train_net args...

- REID_TEST_COMPILE_MARK=PATH: the file PATH appears when inductor starts lowering a graph (the run is
  compiling a step);
- REID_TEST_SLOW_EVAL=PATH: each evaluation creates the file PATH, then waits (up to 120 s, in short
  sleeps) before it evaluates: an evaluation long enough to be signalled in.

The patches are made at import, so they also apply in worker processes started with spawn, which import
this script again as ``__mp_main__``.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from reid_engine.engine.defaults import DefaultTrainer  # noqa: E402

_compile_mark = os.environ.get("REID_TEST_COMPILE_MARK", "")
_eval_mark = os.environ.get("REID_TEST_SLOW_EVAL", "")
#: seconds a slow evaluation waits before it evaluates
SLOW_EVAL_S = 120.0


def _touch(path):
    with open(path, "a"):
        pass


if _compile_mark:
    import torch._inductor.graph as inductor_graph

    _lower = inductor_graph.GraphLowering.run

    def _marked_lower(self, *args, **kwargs):
        _touch(_compile_mark)
        return _lower(self, *args, **kwargs)

    inductor_graph.GraphLowering.run = _marked_lower

if _eval_mark:
    _test = DefaultTrainer.test.__func__

    def _slow_test(cls, *args, **kwargs):
        _touch(_eval_mark)
        deadline = time.monotonic() + SLOW_EVAL_S
        while time.monotonic() < deadline:  # Python sleeps: the stop handler runs between them
            time.sleep(0.05)
        return _test(cls, *args, **kwargs)

    DefaultTrainer.test = classmethod(_slow_test)

if __name__ == "__main__":
    from reid_engine.cli.train import main

    sys.exit(main(sys.argv[1:]))
