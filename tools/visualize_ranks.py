#!/usr/bin/env python
"""Look at what a trained model retrieves: rank lists, ROC curve and distance histograms.

The same command as `reid-visualize` (see `reid_engine/cli/visualize.py` and `--help`).
"""
import sys

from reid_engine.cli.visualize import main

if __name__ == "__main__":
    sys.exit(main())
