#!/usr/bin/env python
"""Benchmark deployment back ends on the CPU: PyTorch eager, TorchScript, ONNX Runtime fp32 and int8.

For each model it exports TorchScript and ONNX files (`reid_engine.export.export_model`), quantizes
the ONNX file to int8 (static QDQ, per-channel weights, calibrated on --calibration-size images of
SyntheticReID's train split), then prints per back end the CPU images/s (best of repeated calls
over --seconds, random uint8 images at batch 1 and 32) and the mAP on SyntheticReID's test split
(the evaluator of `reid-train --eval-only`). Every back end includes the config's flip averaging
and L2 normalization.

Models:
  main  the README's main job, configs/SyntheticReID/bagtricks_R18-half-ibn.yml (96x48, flip test);
  r50   BoT ResNet-50 at 256x128, configs/Market1501/bagtricks_R50.yml, tested on SyntheticReID.
Without --main-weights / --r50-weights a model keeps its seeded random initialization: its rows
say "untrained", and only their speeds and int8-vs-fp32 agreement mean something.

torch and ONNX Runtime both use --threads intra-op threads; set OMP_NUM_THREADS to the same value.
On a shared machine best-of-N reduces the noise but does not remove it. Commands and figures:
docs/benchmarks.md ("Back ends").
"""
import argparse
import os
import tempfile

import numpy as np
import torch
from harness import REPO, Stopwatch
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.export import (
    CalibrationBatches,
    calibration_paths,
    evaluate_on_test_set,
    export_model,
    images_per_second,
    input_image_size,
    quantize_and_verify,
    quantize_onnx,
)
from reid_engine.inference import (
    FeatureExtractor,
    OnnxRuntimeModel,
    build_inference_model,
    contract_config,
    read_contract,
)
from reid_engine.utils.logger import setup_logger

MODELS = {
    "main": ("configs/SyntheticReID/bagtricks_R18-half-ibn.yml", []),
    "r50": ("configs/Market1501/bagtricks_R50.yml",
            ["INPUT.SIZE_TEST", [256, 128], "DATASETS.TESTS", ("SyntheticReID",), "DATASETS.NAMES", ("SyntheticReID",)]),
}
BACKENDS = ("eager", "torchscript", "onnx", "int8")
LABELS = {"eager": "PyTorch eager", "torchscript": "TorchScript", "onnx": "ONNX Runtime fp32", "int8": "ONNX Runtime int8"}


class _TorchScriptModel(nn.Module):
    """A loaded TorchScript feature module with the model interface of the evaluation loop."""

    def __init__(self, path: str):
        super().__init__()
        self.module = torch.jit.load(path)

    @property
    def device(self):
        return torch.device("cpu")

    def forward(self, batch):
        return self.module(batch["images"] if isinstance(batch, dict) else batch)


def torch_run(module):
    """A timing callable: the module on a uint8 numpy batch, without autograd."""
    def run(images):
        with torch.inference_mode():
            return module(torch.from_numpy(images))
    return run


def model_config(config_file: str, weights: str, data_root: str, overrides=()):
    """The frozen config of a benchmarked model, on the CPU, with its weights (none: "")."""
    cfg = get_cfg()
    cfg.merge_from_file(config_file)
    cfg.merge_from_list([*overrides, "MODEL.DEVICE", "cpu", "MODEL.BACKBONE.PRETRAIN", False, "MODEL.WEIGHTS", weights or "",
                         "DATASETS.ROOT", data_root, "DATALOADER.NUM_WORKERS", 0, "TEST.RANK_VIS", False])
    cfg.freeze()
    return cfg


def bench_model(name: str, weights: str, args) -> dict:
    """Export, quantize, time and evaluate one model; returns {backend: {"b1", "b32", "mAP", "R1"}}."""
    cfg = model_config(os.path.join(REPO, MODELS[name][0]), weights, args.data_root, MODELS[name][1])
    torch.manual_seed(0)  # the seeded random initialization when no weights are given
    model = build_inference_model(cfg)
    eager = FeatureExtractor(model, normalize=True, flip=cfg.TEST.FLIP.ENABLED).eval()
    rng = np.random.default_rng(0)
    size = input_image_size(cfg)
    batches = {batch: rng.integers(0, 256, (batch, 3) + size).astype(np.uint8) for batch in (1, 32)}
    # PyTorch eager is timed first, in a process that has run nothing else yet: timed after
    # the exports and ONNX Runtime sessions it measured several times slower (cause unknown).
    rows = {"eager": {f"b{batch}": images_per_second(torch_run(eager), images, args.seconds)
                      for batch, images in batches.items()}}
    out = os.path.join(args.output, name)
    results = export_model(cfg, out, model=model, source_config=MODELS[name][0])
    with Stopwatch() as watch:
        if args.no_map:  # quantize only: no evaluation at all
            fp32 = OnnxRuntimeModel(results["onnx"]["path"])
            paths = calibration_paths(cfg, "train", args.calibration_size)
            reader = CalibrationBatches(paths, contract_config(cfg, fp32.contract), fp32.contract)
            quant = {"path": quantize_onnx(fp32.path, os.path.join(out, "model_int8.onnx"), "int8", reader)}
        else:
            quant = quantize_and_verify(cfg, results["onnx"]["path"], "int8", calibration="train",
                                        calibration_size=args.calibration_size, max_map_drop=float("inf"), speed_seconds=0.5)
    what = "int8 quantization" if args.no_map else "int8 quantization + fp32/int8 evaluation"
    print(f"[{name}] {what}: {watch.wall:.0f} s", flush=True)
    contract = read_contract(results["onnx"]["path"])
    assert (contract.input_height, contract.input_width) == size
    scripted = _TorchScriptModel(results["torchscript"]["path"])
    onnx_fp32 = OnnxRuntimeModel(results["onnx"]["path"], threads=args.threads)
    onnx_int8 = OnnxRuntimeModel(quant["path"], threads=args.threads)

    runners = {"torchscript": torch_run(scripted.module), "onnx": onnx_fp32.run, "int8": onnx_int8.run}
    for backend in BACKENDS:
        if backend in runners:
            rows[backend] = {f"b{batch}": images_per_second(runners[backend], images, args.seconds)
                             for batch, images in batches.items()}
        row = rows[backend]
        print(f"[{name}] {LABELS[backend]}: {row['b1']:.1f} img/s at batch 1, {row['b32']:.1f} at batch 32", flush=True)
    models = {"eager": (model, None), "torchscript": (scripted, contract), "onnx": (onnx_fp32, None), "int8": (onnx_int8, None)}
    for backend in ([] if args.no_map else args.map_for):
        if backend in ("onnx", "int8"):  # evaluated by quantize_and_verify
            rows[backend]["mAP"] = quant["fp32_map" if backend == "onnx" else "int8_map"]
        else:
            rows[backend]["mAP"] = evaluate_on_test_set(cfg, *models[backend], label=f"Evaluating {backend}")["mAP"]
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--main-weights", default="", help="checkpoint of the main job (default: untrained)")
    parser.add_argument("--r50-weights", default="", help="checkpoint of the R50 BoT (default: untrained)")
    parser.add_argument("--data-root", default=os.path.join(REPO, "datasets"), help="where SyntheticReID is (or goes)")
    parser.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime intra-op threads")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per back end and batch size")
    parser.add_argument("--calibration-size", type=int, default=256, help="int8 calibration images")
    parser.add_argument("--map-for", nargs="*", default=list(BACKENDS), choices=BACKENDS,
                        help="back ends whose mAP is measured (ONNX fp32 and int8 always are, for the int8 check)")
    parser.add_argument("--no-map", action="store_true", help="speeds only: quantize without evaluating anything")
    parser.add_argument("--output", default="", help="folder for the exported files (default: a temporary one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    setup_logger()
    with tempfile.TemporaryDirectory() as tmp:
        args.output = args.output or tmp
        args.map_for = sorted(set(args.map_for) | {"onnx", "int8"}, key=BACKENDS.index)
        print(f"torch {torch.__version__}, {args.threads} threads (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})")
        table = {}
        for name in args.models:
            weights = args.main_weights if name == "main" else args.r50_weights
            table[name] = (bench_model(name, weights, args), "trained" if weights else "untrained")
            print(f"[{name}] weights: {weights or 'seeded random initialization (untrained)'}")
    print(f"\n{'model':<6} {'weights':<10} {'back end':<18} {'img/s b1':>9} {'img/s b32':>10} {'x eager b32':>11} {'mAP':>7}")
    for name, (rows, weights) in table.items():
        for backend, row in rows.items():
            shown = f"{row['mAP']:.2f}" if "mAP" in row else "-"
            print(f"{name:<6} {weights:<10} {LABELS[backend]:<18} {row['b1']:>9.1f} {row['b32']:>10.1f} "
                  f"{row['b32'] / rows['eager']['b32']:>10.2f}x {shown:>7}")
        drop = f"{rows['onnx']['mAP'] - rows['int8']['mAP']:.2f}" if "mAP" in rows["int8"] else "not measured"
        print(f"{name}: int8 vs PyTorch eager at batch 32: {rows['int8']['b32'] / rows['eager']['b32']:.2f}x "
              f"(target >= 2x); int8 mAP drop vs fp32: {drop} points (target <= 1.0)")


if __name__ == "__main__":
    main()
