#!/usr/bin/env python
"""Train or evaluate a ReID model from a config file.

The same command as `reid-train` (see `reid_engine/cli/train.py` and `--help`).
"""
import sys

from reid_engine.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
