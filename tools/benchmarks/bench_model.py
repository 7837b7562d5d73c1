#!/usr/bin/env python
"""Benchmark the ReID models: parameters, FLOPs and training-step time.

For each model: the parameter count, the inference FLOPs of one 256x128 image (fvcore; one
multiply-add = one flop) and the time of an SGD training step (CE + triplet) on a batch of random
uint8 images of P x K identities, e.g. ``--device cuda --steps 20``.
"""
import argparse
import statistics

import torch
from harness import bot_config, random_batch, timed, train_step

from reid_engine.modeling import build_model
from reid_engine.modeling.meta_arch import count_flops, count_parameters

# name -> (depth, input height, input width)
MODELS = {
    "R50-BoT@256x128": ("50x", 256, 128),
    "R50-BoT@128x64": ("50x", 128, 64),
    "R18-BoT@128x64": ("18x", 128, 64),
}
FLOP_SIZE = (256, 128)


def time_training_steps(model, batch, steps: int, warmup: int, amp_dtype=None, verbose: bool = True):
    """Wall seconds of `steps` SGD steps after `warmup` ones (autocast to `amp_dtype` when given)."""
    model.train()
    step = train_step(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), batch, amp_dtype)

    def show(index, seconds):
        print(f"  step {index + 1}/{warmup + steps} ({'warmup' if index < warmup else 'timed'}): {seconds:.3f}s", flush=True)
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
        model = build_model(bot_config(depth, (height, width), args.device))
        params, flops = count_parameters(model), count_flops(model, FLOP_SIZE)
        batch = random_batch(args.batch, args.instances, height, width, model.device)
        results[name] = (params, flops, statistics.median(time_training_steps(model, batch, args.steps, args.warmup)))
        del model, batch

    print(f"\n{'model':<18} {'params (M)':>10} {'GFLOPs@256x128':>15} {'train step (s)':>15} {'images/s':>9}")
    for name, (params, flops, step) in results.items():
        print(f"{name:<18} {params / 1e6:>10.2f} {flops / 1e9:>15.3f} {step:>15.3f} {args.batch / step:>9.1f}")
    first, *others = results
    for other in others:
        print(f"step-time ratio {first} / {other}: {results[first][2] / results[other][2]:.2f}")

if __name__ == "__main__":
    main()
