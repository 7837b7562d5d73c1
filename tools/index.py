#!/usr/bin/env python
"""Index a gallery and search it by image.

The same command as `reid-index` (see `reid_engine/cli/index.py` and `--help`).
"""
import sys

from reid_engine.cli.index import main

if __name__ == "__main__":
    sys.exit(main())
