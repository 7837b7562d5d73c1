#!/usr/bin/env python
"""Train or evaluate a ReID model from a config file.

    python tools/train_net.py --config-file configs/SyntheticReID/bagtricks_R18_small.yml
    python tools/train_net.py --config-file x.yml --eval-only MODEL.WEIGHTS output/model_final.pth
    python tools/train_net.py --config-file x.yml --resume
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from reid_engine.engine.cli import run  # noqa: E402

if __name__ == "__main__":
    sys.exit(run())
