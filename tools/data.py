#!/usr/bin/env python
"""Check a dataset under the data root without training: statistics per split and every badly laid-out file.

The same command as `reid-data` (see `reid_engine/cli/data.py` and `--help`).
"""
import sys

from reid_engine.cli.data import main

if __name__ == "__main__":
    sys.exit(main())
