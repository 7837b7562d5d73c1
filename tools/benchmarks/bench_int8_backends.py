#!/usr/bin/env python
"""Benchmark int8 back ends side by side on the CPU: PyTorch eager, ONNX Runtime fp32 / int8, OpenVINO fp32 / int8.

It exports --config-file's model (with --weights) as ONNX and OpenVINO IR, quantizes both to int8
on --calibration-size train images (ONNX Runtime static QDQ: `quantize_and_verify`; OpenVINO NNCF:
`quantize_openvino_and_verify`, both evaluating every file on DATASETS.TESTS[0] as `reid-train
--eval-only` does), then times the five back ends on one random uint8 batch of --batch images in
interleaved rounds (rotated order), with one thread and with all this process may use, and reports
the median round. Every back end includes flip averaging and L2 normalization: the ratios to
PyTorch eager compare like with like.

Targets (issue 38): OpenVINO int8 at least 2x PyTorch eager at batch 32, mAP drop at most 1.0 point.
The README's figures and their commands (train the model first): docs/benchmarks.md.
"""
import argparse
import os
import statistics
import tempfile

import numpy as np
import torch
from bench_deploy import model_config, torch_run  # the same config and eager call as bench_deploy's
from harness import REPO, interleaved

from reid_engine.export import export_model, input_image_size, quantize_and_verify, quantize_openvino_and_verify
from reid_engine.inference import FeatureExtractor, OnnxRuntimeModel, OpenVinoModel, build_inference_model
from reid_engine.utils.logger import setup_logger

LABELS = {"eager": "PyTorch eager", "ort_fp32": "ONNX Runtime fp32", "ort_int8": "ONNX Runtime int8",
          "ov_fp32": "OpenVINO fp32", "ov_int8": "OpenVINO int8"}


def export_and_quantize(cfg, model, out: str, calibration_size: int):
    """Export ONNX + OpenVINO IR, quantize both (no drop limit); returns ({back end: path}, {back end: mAP})."""
    results = export_model(cfg, out, formats=["onnx", "openvino"], model=model)
    onnx = quantize_and_verify(cfg, results["onnx"]["path"], "int8", calibration="train",
                               calibration_size=calibration_size, max_map_drop=float("inf"), speed_seconds=0.2)
    openvino = quantize_openvino_and_verify(cfg, results["openvino"]["path"], calibration="train",
                                            calibration_size=calibration_size, max_map_drop=float("inf"), speed_seconds=0.2)
    paths = {"ort_fp32": results["onnx"]["path"], "ort_int8": onnx["path"],
             "ov_fp32": results["openvino"]["path"], "ov_int8": openvino["path"]}
    maps = {"ort_fp32": onnx["fp32_map"], "ort_int8": onnx["int8_map"],
            "ov_fp32": openvino["fp32_map"], "ov_int8": openvino["int8_map"]}
    return paths, maps


def runners(eager, paths, threads: int):
    """{back end: callable on a uint8 numpy batch} with `threads` intra-op threads each."""
    torch.set_num_threads(threads)
    kinds = {"ort": OnnxRuntimeModel, "ov": OpenVinoModel}
    return {"eager": torch_run(eager), **{name: kinds[name.split("_")[0]](path, threads=threads).run
                                          for name, path in paths.items()}}


def interleaved_speeds(runs, images: np.ndarray, rounds: int, calls: int) -> dict:
    """{back end: median images/s over `rounds` rounds}; each round times `calls` calls of every back end,
    in an order rotated each round (two untimed calls first: they allocate and pick kernels)."""
    samples = interleaved({name: lambda run=run: run(images) for name, run in runs.items()}, rounds, calls, warmup=2, rotate=True)
    return {name: calls * len(images) / statistics.median(values) for name, values in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-file", default=os.path.join(REPO, "configs/SyntheticReID/bagtricks_R18-half-ibn.yml"))
    parser.add_argument("--weights", default="", help="trained checkpoint (default: seeded random initialization)")
    parser.add_argument("--data-root", default=os.path.join(REPO, "datasets"), help="where SyntheticReID is (or goes)")
    parser.add_argument("--batch", type=int, default=32, help="images per timed call")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (the median is reported)")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per back end and round")
    parser.add_argument("--calibration-size", type=int, default=256, help="int8 calibration images (train split)")
    parser.add_argument("--eager-map", action="store_true",
                        help="also evaluate PyTorch eager (its features equal the fp32 files' within 1e-5)")
    parser.add_argument("--output", default="", help="folder for the exported files (default: a temporary one)")
    args = parser.parse_args(argv)
    setup_logger()
    cfg = model_config(args.config_file, args.weights, args.data_root)
    torch.manual_seed(0)  # the seeded random initialization when no weights are given
    model = build_inference_model(cfg)
    eager = FeatureExtractor(model, normalize=True, flip=cfg.TEST.FLIP.ENABLED).eval()
    all_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        paths, maps = export_and_quantize(cfg, model, args.output or tmp, args.calibration_size)
        if args.eager_map:
            from reid_engine.export import evaluate_on_test_set

            maps["eager"] = evaluate_on_test_set(cfg, model, label="Evaluating eager")["mAP"]
        images = np.random.default_rng(0).integers(0, 256, (args.batch, 3) + input_image_size(cfg)).astype(np.uint8)
        speeds = {}
        for threads in sorted({1, all_threads}):
            speeds[threads] = interleaved_speeds(runners(eager, paths, threads), images, args.rounds, args.calls)
    print(f"\n{args.config_file} ({'weights ' + args.weights if args.weights else 'untrained'}), "
          f"batch {args.batch}, median of {args.rounds} interleaved rounds of {args.calls} calls; "
          f"torch {torch.__version__}, CPU threads available: {all_threads}")
    header = "".join(f" {f'img/s {t}T':>10} {f'x eager {t}T':>11}" for t in speeds)
    print(f"{'back end':<18}{header} {'mAP':>7}")
    for name, label in LABELS.items():
        cells = "".join(f" {speeds[t][name]:>10.1f} {speeds[t][name] / speeds[t]['eager']:>10.2f}x" for t in speeds)
        shown = f"{maps[name]:.2f}" if name in maps else "-"
        print(f"{label:<18}{cells} {shown:>7}")
    for prefix, label in (("ov", "OpenVINO"), ("ort", "ONNX Runtime")):
        ratios = ", ".join(f"{speeds[t][prefix + '_int8'] / speeds[t]['eager']:.2f}x ({t} thread{'s' * (t > 1)})" for t in speeds)
        print(f"{label} int8 vs PyTorch eager at batch {args.batch}: {ratios}; mAP drop vs fp32: "
              f"{maps[prefix + '_fp32'] - maps[prefix + '_int8']:.2f} points (targets: >= 2x, <= 1.0)")


if __name__ == "__main__":
    main()
