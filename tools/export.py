#!/usr/bin/env python
"""Export a trained model to TorchScript and ONNX, and check the exports against PyTorch.

The same command as `reid-export` (see `reid_engine/cli/export.py` and `--help`).
"""
import sys

from reid_engine.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
