#!/usr/bin/env python
"""Benchmark the ReID models: parameters, FLOPs and training-step time.

For each model it prints the parameter count, the inference FLOPs of one 256x128
image (fvcore; one multiply-add = one flop) and the time of a full training step
(forward, CE + triplet losses, backward, SGD step) on a batch of random uint8 images
with P x K identities.

Example:
    python tools/benchmarks/bench_model.py                      # CPU, 2 threads, batch 64
    python tools/benchmarks/bench_model.py --device cuda --steps 20
"""
import argparse
import statistics

import torch
from harness import timed

from reid_engine.config import get_cfg
from reid_engine.modeling import build_model
from reid_engine.modeling.meta_arch import count_flops, count_parameters

# name -> (depth, input height, input width)
MODELS = {
    "R50-BoT@256x128": ("50x", 256, 128),
    "R50-BoT@128x64": ("50x", 128, 64),
    "R18-BoT@128x64": ("18x", 128, 64),
}
FLOP_SIZE = (256, 128)


def bot_config(depth: str, height: int, width: int, device: str, num_classes: int,
               backbone: str = "build_resnet_backbone"):
    """The BoT model (BNNeck, CE with label smoothing 0.1, hard-mining triplet 0.3) on the
    backbone `backbone` (MODEL.BACKBONE.NAME) of depth `depth`, without ImageNet weights."""
    cfg = get_cfg()
    cfg.MODEL.DEVICE = device
    cfg.MODEL.BACKBONE.NAME = backbone
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.WITH_BNNECK = True
    cfg.MODEL.HEADS.NUM_CLASSES = num_classes
    cfg.MODEL.LOSSES.NAME = ("CrossEntropyLoss", "TripletLoss")
    cfg.MODEL.LOSSES.CE.EPSILON = 0.1
    cfg.MODEL.LOSSES.TRI.HARD_MINING = True
    cfg.MODEL.LOSSES.TRI.MARGIN = 0.3
    cfg.INPUT.SIZE_TRAIN = [height, width]
    cfg.INPUT.SIZE_TEST = [height, width]
    return cfg


def make_batch(batch: int, instances: int, height: int, width: int, device: torch.device):
    """Random uint8 images with batch // instances identities of `instances` images."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, 3, height, width), dtype=torch.uint8, generator=gen)
    targets = torch.arange(batch // instances).repeat_interleave(instances)
    return {"images": images.to(device), "targets": targets.to(device)}


def time_training_steps(model, batch, steps: int, warmup: int, amp_dtype=None, verbose: bool = True):
    """Return the wall times (s) of `steps` training steps after `warmup` untimed ones
    (autocast to `amp_dtype` on the model's device when given)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()

    def step():
        with torch.autocast(model.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            losses = model(batch)
        optimizer.zero_grad(set_to_none=True)
        sum(losses.values()).backward()
        optimizer.step()

    def show(index, seconds):
        tag = "warmup" if index < warmup else "timed"
        print(f"  step {index + 1}/{warmup + steps} ({tag}): {seconds:.3f}s", flush=True)
    return timed(step, steps, warmup, model.device, each=show if verbose else None)[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--instances", type=int, default=4, help="images per identity (K)")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} CPU threads, "
          f"batch {args.batch} ({args.batch // args.instances} ids x {args.instances})")

    results = {}
    for name in args.models:
        depth, height, width = MODELS[name]
        print(f"{name}: building", flush=True)
        cfg = bot_config(depth, height, width, args.device, num_classes=751)
        model = build_model(cfg)
        params = count_parameters(model)
        flops = count_flops(model, FLOP_SIZE)
        batch = make_batch(args.batch, args.instances, height, width, model.device)
        times = time_training_steps(model, batch, args.steps, args.warmup)
        results[name] = (params, flops, statistics.median(times))
        del model, batch

    print()
    print(f"{'model':<18} {'params (M)':>10} {'GFLOPs@256x128':>15} {'train step (s)':>15} "
          f"{'images/s':>9}")
    for name, (params, flops, step) in results.items():
        print(f"{name:<18} {params / 1e6:>10.2f} {flops / 1e9:>15.3f} {step:>15.3f} "
              f"{args.batch / step:>9.1f}")
    names = list(results)
    for other in names[1:]:
        print(f"step-time ratio {names[0]} / {other}: "
              f"{results[names[0]][2] / results[other][2]:.2f}")


if __name__ == "__main__":
    main()
