#!/usr/bin/env python
"""Benchmark the CPU bfloat16 weight gradient of convolutions: oneDNN's kernel against one
matrix product (reid_engine.modeling.layers.cpu_bf16_conv), per layer shape and for a whole step.

1. Per shape (batch, channels in, H x W, channels out, kernel, stride): milliseconds of the weight
   gradient alone in bfloat16 and channels_last, oneDNN (aten.convolution_backward) against
   `matmul_weight_grad`, their ratio, and whether `uses_matmul_weight_grad` picks the product.
2. The model-only training step (forward, backward, Adam) of --config-file's model under bfloat16
   autocast, every convolution on oneDNN against the model as build_model makes it, interleaved.
Meaningful on a CPU that computes bfloat16 natively (AVX512-BF16 or AMX).
"""
import argparse
import copy
import os
import statistics

import torch
import torch.nn.functional as F
from harness import REPO, interleaved, print_command, print_table, random_batch, timed, train_step
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.engine import DefaultTrainer
from reid_engine.modeling.layers.cpu_bf16_conv import (
    MatmulGradConv2d,
    convert_to_matmul_grad_convs,
    matmul_weight_grad,
    uses_matmul_weight_grad,
)
from reid_engine.solver import build_optimizer
from reid_engine.utils.env import cpu_native_bf16

MAIN_JOB = os.path.join(REPO, "configs", "SyntheticReID", "bagtricks_R18-half-ibn.yml")
# (in, H, W, out, kernel, stride): the main job's layers (half-width ResNet-18 at 96x48, last
# stride 1) and a ResNet-50's at 256x128
SHAPES = [(3, 96, 48, 32, 7, 2), (32, 24, 12, 32, 3, 1), (32, 24, 12, 64, 3, 2), (64, 12, 6, 64, 3, 1),
          (64, 12, 6, 128, 3, 2), (128, 6, 3, 128, 3, 1), (128, 6, 3, 256, 3, 1), (256, 6, 3, 256, 3, 1),
          (128, 6, 3, 256, 1, 1), (256, 16, 8, 256, 3, 1), (512, 16, 8, 512, 3, 1), (1024, 16, 8, 256, 1, 1)]


def milliseconds(fn, repeats: int) -> float:
    """Median wall milliseconds of `fn()` over `repeats` calls, after two untimed ones."""
    return 1e3 * statistics.median(timed(fn, repeats, warmup=2)[0])


def bench_shape(batch: int, shape, repeats: int) -> tuple:
    """The table row of one layer's bfloat16 weight gradient: shape, oneDNN ms, matrix product ms, ratio, picked."""
    cin, h, w, cout, k, s = shape
    pad = k // 2
    x = torch.randn(batch, cin, h, w, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    conv = MatmulGradConv2d(cin, cout, k, s, pad, bias=False).to(memory_format=torch.channels_last)
    weight = conv.weight.detach().to(torch.bfloat16)
    grad_out = torch.randn_like(F.conv2d(x, weight, None, s, pad))
    onednn = milliseconds(lambda: torch.ops.aten.convolution_backward(
        grad_out, x, weight, None, [s, s], [pad, pad], [1, 1], False, [0, 0], 1, [False, True, False]), repeats)
    matmul = milliseconds(lambda: matmul_weight_grad(grad_out, x, k, s, pad), repeats)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        picked = uses_matmul_weight_grad(conv, x.float())
    return (f"{cin}, {h}x{w}, {cout}, {k}x{k}, {s}", f"{onednn:.2f}", f"{matmul:.2f}", f"{onednn / matmul:.2f}",
            "yes" if picked else "no")


def as_onednn(model: nn.Module) -> nn.Module:
    """A copy of `model` whose convolutions are all plain nn.Conv2d (oneDNN's weight gradient)."""
    plain = copy.deepcopy(model)
    for module in plain.modules():
        if type(module) is MatmulGradConv2d:
            module.__class__ = nn.Conv2d
    return plain


def bench_model(args) -> tuple:
    """(s/step with oneDNN, s/step as built, number of converted convolutions) of the model-only step."""
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.MODEL.DEVICE, cfg.MODEL.BACKBONE.PRETRAIN, cfg.SOLVER.AMP.ENABLED = "cpu", False, True
    cfg.MODEL.HEADS.NUM_CLASSES = args.classes
    torch.manual_seed(0)
    built = convert_to_matmul_grad_convs(DefaultTrainer.build_model(cfg))  # also where bf16 is emulated
    converted = sum(type(m) is MatmulGradConv2d for m in built.modules())
    batch = random_batch(args.batch, cfg.DATALOADER.NUM_INSTANCE, *args.size)
    steps = {name: train_step(model, build_optimizer(cfg, model), batch, torch.bfloat16)
             for name, model in (("onednn", as_onednn(built)), ("built", built))}
    times = interleaved(steps, args.rounds, args.steps, args.warmup)
    return statistics.median(times["onednn"]) / args.steps, statistics.median(times["built"]) / args.steps, converted


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", default=MAIN_JOB, help="the model of the whole-step comparison")
    parser.add_argument("--size", type=int, nargs=2, default=(96, 48), metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--classes", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per shape")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds of the whole-step comparison")
    parser.add_argument("--steps", type=int, default=5, help="steps per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each model first")
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="how many of the layer shapes to time")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; native bfloat16: "
          f"{cpu_native_bf16() or 'no (emulated: the figures say little)'}")
    print_table(("layer (in, H x W, out, kernel, stride)", "oneDNN ms", "matrix product ms", "oneDNN / product", "used"),
                (bench_shape(args.batch, shape, args.repeats) for shape in SHAPES[:args.shapes]), "lrrrl")
    onednn, built, converted = bench_model(args)
    print(f"\nmodel-only step of {os.path.relpath(args.config_file, REPO)} at {args.size[0]}x{args.size[1]}, "
          f"batch {args.batch}, bfloat16 autocast ({converted} convolutions converted): oneDNN {onednn:.3f} s, "
          f"as built {built:.3f} s, speed-up {onednn / built:.2f}x")
    print_command(__file__, argv)


if __name__ == "__main__":
    main()
