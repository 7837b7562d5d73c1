#!/usr/bin/env python
"""Search hyperparameters with Optuna, each trial one training run.

The same command as `reid-tune` (see `reid_engine/cli/tune.py` and `--help`).
"""
import sys

from reid_engine.cli.tune import main

if __name__ == "__main__":
    sys.exit(main())
