#!/usr/bin/env python
"""Embed a dataset split or a folder of images with a trained model and save the features.

The same command as `reid-extract` (see `reid_engine/cli/extract.py` and `--help`).
"""
import sys

from reid_engine.cli.extract import main

if __name__ == "__main__":
    sys.exit(main())
