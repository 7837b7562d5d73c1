#!/usr/bin/env python
"""Write the SyntheticReID benchmark (and / or a contact sheet of samples) explicitly.

The same command as `reid-make-synthetic` (see `reid_engine/cli/make_synthetic.py` and `--help`).
"""
import sys

from reid_engine.cli.make_synthetic import main

if __name__ == "__main__":
    sys.exit(main())
