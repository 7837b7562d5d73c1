"""The command line: one module per command, one parser base, one error boundary.

=====================  ==============================  =========================
console script         module                          tools/ wrapper
=====================  ==============================  =========================
reid-train             reid_engine.cli.train           tools/train_net.py
reid-extract           reid_engine.cli.extract         tools/extract_features.py
reid-export            reid_engine.cli.export          tools/export.py
reid-visualize         reid_engine.cli.visualize       tools/visualize_ranks.py
reid-make-synthetic    reid_engine.cli.make_synthetic  tools/make_synthetic.py
reid-data              reid_engine.cli.data            tools/data.py
reid-tune              reid_engine.cli.tune            tools/tune_net.py
reid-index             reid_engine.cli.index           tools/index.py
=====================  ==============================  =========================

Each command module has `build_parser()` (on `base.command_parser`), `run(args)` (the
body) and `main(argv=None) -> int` (parse, run, and `boundary.run_command`'s error
handling). `args` holds the flag groups the parsers are built from (and the classic
`default_argument_parser`), `summary` the block a completed `reid-train` run ends with.
Layering: the top; it may import every other package.
"""
from ..runtime import thread_policy

# Before torch is imported (the command modules below import it): libgomp reads OMP_WAIT_POLICY
# once, when torch loads it. Quiet cores keep OpenMP's spinning default, busy ones get PASSIVE
# (runtime.thread_policy; docs/performance.md, "Threads"); a user's own OMP_WAIT_POLICY is kept.
thread_policy.choose_at_start()
