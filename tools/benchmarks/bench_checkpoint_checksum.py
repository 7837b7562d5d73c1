#!/usr/bin/env python
"""Benchmark what the checkpoint checksum costs: save and load times with and without it.

Builds a BoT ResNet (default: ResNet-50, 751 classes, as on Market-1501) on the CPU with Adam
state (one step) and saves / loads ``{"model", "optimizer", "iteration"}`` into a temporary
folder: through ``Checkpointer`` (checksum on save, checked on load), through the same atomic save
with a constant checksum, and through plain ``torch.save`` / ``torch.load(weights_only=True)``.
Prints the file size, the best of ``--repeats`` wall times of each, the checksum's own time and
the ratios.
"""

import argparse
import os
import tempfile
from unittest import mock

import torch
from harness import bot_config, timed

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

    model = build_model(bot_config(args.depth))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # Adam state: two more tensors per parameter

    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        checkpointer = Checkpointer(model, folder, save_to_disk=True, optimizer=optimizer)
        plain_path = os.path.join(folder, "plain.pth")
        data = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": 1}
        ours_save = _best(lambda: checkpointer.save("model_0000001", iteration=1), args.repeats)
        with mock.patch.object(checkpoint_module, "payload_checksum", lambda _: "none"):  # the same atomic save
            unchecked_save = _best(lambda: checkpointer.save("model_0000002", iteration=1), args.repeats)
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
    print(f"  load: with checksum {ours_load:7.3f} s, plain torch.load {plain_load:7.3f} s, ratio {ours_load / plain_load:.2f}")


if __name__ == "__main__":
    main()
