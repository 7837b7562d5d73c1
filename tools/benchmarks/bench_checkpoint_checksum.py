#!/usr/bin/env python
"""Benchmark what the checkpoint checksum costs: save and load times with and without it.

Builds a BoT ResNet (default: ResNet-50, 751 classes, as on Market-1501) on the CPU, gives it
Adam state (one step), and saves / loads ``{"model", "optimizer", "iteration"}`` through
``Checkpointer`` (checksum computed on save, checked on load), through the same atomic
save with the checksum replaced by a constant, and through plain ``torch.save`` /
``torch.load(weights_only=True)``, into a temporary folder. Prints the file
size, the best of ``--repeats`` wall times of each, the checksum's own time and the ratios.

Usage:
    python tools/benchmarks/bench_checkpoint_checksum.py [--depth 50x] [--repeats 3] [--dir /tmp]
"""

import argparse
import os
import tempfile

import torch
from harness import timed

from reid_engine.config import get_cfg
from reid_engine.modeling import build_model
from reid_engine.utils import checkpoint as checkpoint_module
from reid_engine.utils.checkpoint import Checkpointer
from reid_engine.utils.checksum import payload_checksum
from reid_engine.utils.safe_load import load_checkpoint_file


def _best(fn, repeats: int) -> float:
    return min(timed(fn, repeats)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", default="50x", help="MODEL.BACKBONE.DEPTH")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="folder for the files (default: the system temp folder)")
    args = parser.parse_args()

    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.DEPTH = args.depth
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = 751
    model = build_model(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # Adam state: two more tensors per parameter

    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        checkpointer = Checkpointer(model, folder, save_to_disk=True, optimizer=optimizer)
        plain_path = os.path.join(folder, "plain.pth")
        data = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": 1}
        ours_save = _best(lambda: checkpointer.save("model_0000001", iteration=1), args.repeats)
        real_checksum = checkpoint_module.payload_checksum
        checkpoint_module.payload_checksum = lambda _: "none"  # the same atomic save (fsync, rename, tag)
        try:
            unchecked_save = _best(lambda: checkpointer.save("model_0000002", iteration=1), args.repeats)
        finally:
            checkpoint_module.payload_checksum = real_checksum
        plain_save = _best(lambda: torch.save(data, plain_path), args.repeats)
        ours_path = os.path.join(folder, "model_0000001.pth")
        ours_load = _best(lambda: load_checkpoint_file(ours_path), args.repeats)
        plain_load = _best(lambda: torch.load(plain_path, map_location="cpu", weights_only=True), args.repeats)
        digest = _best(lambda: payload_checksum(data), args.repeats)
        size = os.path.getsize(ours_path) / 2**20

    print(f"BoT ResNet-{args.depth[:-1]} + Adam state: {size:.0f} MiB per checkpoint (best of {args.repeats})")
    print(f"  checksum alone      {digest:7.3f} s  ({size / digest:.0f} MiB/s)")
    print(f"  save: with checksum {ours_save:7.3f} s, the same atomic save without it {unchecked_save:7.3f} s "
          f"(ratio {ours_save / unchecked_save:.2f}), plain torch.save without fsync {plain_save:7.3f} s")
    print(f"  load: with checksum {ours_load:7.3f} s, plain torch.load {plain_load:7.3f} s, "
          f"ratio {ours_load / plain_load:.2f}")


if __name__ == "__main__":
    main()
