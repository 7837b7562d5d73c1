r"""Export a trained model to TorchScript and ONNX, and check the exports against PyTorch (`reid-export`).

    reid-export --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --output exported/ \
        MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth
    reid-export --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --output exported/ \
        --format onnx --opset 17 --input-dtype float32 --raw-features \
        MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth
    reid-export --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --output exported/ \
        --quantize int8 --calibration train \
        MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth   # + exported/model_int8.onnx
    reid-export --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --output exported/ \
        --format openvino --quantize int8 --calibration train \
        MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth   # model.xml/.bin + model_int8.xml/.bin
    reid-export --inspect exported/model.onnx            # print a file's preprocessing contract

--format takes one format or a comma list (--format onnx,openvino), and may be repeated
(--format onnx --format openvino); the KEY VALUE overrides may follow it directly.

What is exported is the inference model as one module (`FeatureExtractor`):
  input  "images":   (B, 3, H, W) RGB batch with values 0..255, uint8 by default
                     (--input-dtype float32 for float input); H x W is the test size
                     (INPUT.SIZE_TEST, or INPUT.CROP.SIZE with cropping); the
                     mean / std normalization is inside the model;
  output "features": (B, D) float32, L2-normalized by default (--raw-features: the
                     model's features as they are); with TEST.FLIP.ENABLED the
                     mirrored image's features are averaged in.
The batch axis is dynamic in the ONNX file (and in the traced TorchScript module).
Re-parameterisable blocks (RepVGG's 3x3 + 1x1 + identity branches) are fused into one
convolution each before exporting (the log says how many); --no-fuse exports them as
they are.
The TorchScript module runs on the device it was exported on (MODEL.DEVICE).

After exporting, each file is loaded back (ONNX with onnxruntime when it is installed)
and run on a batch of a different size than the export batch; the largest absolute
difference to PyTorch (the unfused model) is printed, and a difference above --atol is
an error.
Every file carries its preprocessing contract (contract_version 2; version 1 files still
read): input size, bicubic resizing of the image decoded at full size, channel order
(RGB), dtype and value range, pixel_mean / pixel_std and whether that normalization is
inside the graph ("inside": feed raw values) or the client's ("outside"), feature
dimension and L2 normalization, the source config and checkpoint by file name with the
checkpoint's sha256 (no local paths), reid_engine version: ONNX metadata_props, a
TorchScript extra file reid_engine_contract.json; --inspect FILE prints it.

--format openvino (not in the default formats: it needs the openvino package) writes
OpenVINO IR, model.xml + model.bin (float32 weights), converted from the ONNX export by
OpenVINO's ONNX reader; its contract is in the IR's rt_info (section reid_engine).

--format boxmot writes reid_engine_boxmot.onnx and reid_engine_boxmot.onnx.metadata.json for
BoxMOT's ONNX appearance back end, as it loads them: float32 input normalized outside with
ImageNet's mean / std (BoxMOT's crops), undone inside the graph before the model's own
MODEL.PIXEL_MEAN / STD; the sidecar gives BoxMOT the input size. Pass the .onnx file as a
tracker's reid_weights (docs/boxmot.md).

--quantize int8 also writes model_int8.onnx: ONNX Runtime static quantization (QDQ,
per-channel int8 weights) calibrated on --calibration-size images of --calibration (an
image folder, or a split of DATASETS.TESTS[0]); --quantize dynamic needs no calibration.
The quantizer's own warnings (e.g. per-channel axes that 1-D IBN weights lack) are
folded into one log line that counts them and says what they mean.
With openvino in --format, --quantize int8 also writes model_int8.xml/.bin: NNCF
post-training quantization calibrated on the same images (needs the nncf package).
Both files are then evaluated on DATASETS.TESTS[0] and timed on the CPU; if the int8 mAP
is more than --max-map-drop points below fp32, the command fails and only the fp32 file
is kept.
The same is importable as `reid_engine.export.export_model` / `quantize_and_verify`.
"""
import argparse
from typing import List, Optional

from ..export import (
    DEFAULT_FORMATS,
    DEFAULT_OPSET,
    FORMATS,
    QUANTIZE_MODES,
    calibration_paths,
    check_calibration_source,
    export_model,
    quantize_and_verify,
    quantize_openvino_and_verify,
)
from ..inference import read_contract
from ..utils.errors import UsageError
from ..utils.logger import setup_logger
from .args import comma_list
from .base import build_config, command_parser, positive_int
from .boundary import run_command

__all__ = ["PROG", "build_parser", "run", "main"]

PROG = "reid-export"


def build_parser() -> argparse.ArgumentParser:
    """The shared base plus the export flags."""
    parser = command_parser(PROG, __doc__)
    parser.add_argument("--output", help="folder for model.pt (TorchScript), model.onnx, model.xml (required to export)")
    parser.add_argument("--inspect", metavar="FILE", help="print the preprocessing contract of an exported file and exit")
    parser.add_argument("--format", type=comma_list(choices=FORMATS, what="format"), action="extend", default=None,
                        metavar="FORMAT[,FORMAT]",
                        help=f"what to export, one of {', '.join(FORMATS)}: a comma list, or the flag repeated "
                             f"(default: {','.join(DEFAULT_FORMATS)})")
    parser.add_argument("--torchscript-mode", choices=("trace", "script"), default="trace",
                        help="trace (default; works for any model) or script (needs scriptable modules)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default {DEFAULT_OPSET})")
    parser.add_argument("--input-dtype", choices=("uint8", "float32"), default="uint8",
                        help="dtype of the exported input; values are 0..255 either way")
    parser.add_argument("--raw-features", action="store_true", help="output the features without L2 normalization")
    parser.add_argument("--batch-size", type=positive_int, default=2, help="batch size used to export")
    parser.add_argument("--check-batch-size", type=positive_int, default=3,
                        help="batch size of the check (differs from --batch-size to test the dynamic axis)")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest accepted |export - PyTorch|")
    parser.add_argument("--no-fuse", action="store_true",
                        help="export re-parameterisable blocks (RepVGG) unfused, as they train")
    parser.add_argument("--quantize", choices=QUANTIZE_MODES,
                        help="also write an int8 ONNX model: int8 (static, calibrated) or dynamic; with "
                             "--format openvino, int8 also writes an NNCF int8 OpenVINO model")
    parser.add_argument("--calibration", default="", metavar="DIR|SPLIT",
                        help="calibration images of --quantize int8: a folder, or train / query / gallery")
    parser.add_argument("--calibration-size", type=positive_int, default=256, help="most calibration images (256)")
    parser.add_argument("--max-map-drop", type=float, default=1.0,
                        help="largest accepted int8 mAP drop on the test split, in points (default 1.0)")
    return parser


def run(args: argparse.Namespace) -> None:
    """Inspect a file, or build the config, export, check (and quantize)."""
    if args.inspect:
        print(read_contract(args.inspect).describe())
        return
    args.format = list(dict.fromkeys(args.format or DEFAULT_FORMATS))  # repeated names once, in order
    if not args.output:
        raise UsageError("no output folder (--output): pass --output DIR to export, or --inspect FILE")
    if args.quantize and not {"onnx", "openvino"} & set(args.format):
        raise UsageError("--quantize works on the ONNX export or the OpenVINO one: add onnx or openvino to --format")
    if args.quantize == "dynamic" and "onnx" not in args.format:
        raise UsageError("--quantize dynamic is ONNX Runtime's: add onnx to --format, or use --quantize int8 "
                         "(NNCF) for the OpenVINO export")
    check_calibration_source(args.quantize, args.calibration)
    setup_logger()
    cfg = build_config(args)
    if args.quantize == "int8":
        calibration_paths(cfg, args.calibration, args.calibration_size)  # a bad source fails before exporting
    results = export_model(cfg, args.output, args.format, args.torchscript_mode, args.opset, args.input_dtype,
                           not args.raw_features, args.batch_size, args.check_batch_size, args.atol,
                           fuse=not args.no_fuse, source_config=args.config_file or "")
    if args.quantize and "onnx" in results:
        quantize_and_verify(cfg, results["onnx"]["path"], args.quantize, args.calibration, args.calibration_size,
                            args.max_map_drop)
    if args.quantize == "int8" and "openvino" in results:
        quantize_openvino_and_verify(cfg, results["openvino"]["path"], args.calibration, args.calibration_size,
                                     args.max_map_drop)


def main(argv: Optional[List[str]] = None) -> int:
    """Run `reid-export` with `argv` (default: sys.argv[1:]); returns the exit status."""
    return run_command(PROG, build_parser(), run, argv)
