#!/usr/bin/env python
"""Export a trained model to TorchScript and ONNX, and check the exports against PyTorch.

    python tools/export.py --config-file cfg.yml --output exported/ MODEL.WEIGHTS output/model_final.pth
    python tools/export.py --config-file cfg.yml --output exported/ --format onnx --opset 17 \\
        --input-dtype float32 --raw-features MODEL.WEIGHTS output/model_final.pth

What is exported is the inference model as one module (`FeatureExtractor`):
  input  "images":   (B, 3, H, W) RGB batch with values 0..255, uint8 by default
                     (--input-dtype float32 for float input); H x W is the test size
                     (INPUT.SIZE_TEST, or INPUT.CROP.SIZE with cropping); the
                     mean / std normalisation is inside the model;
  output "features": (B, D) float32, L2-normalised by default (--raw-features: the
                     model's features as they are); with TEST.FLIP.ENABLED the
                     mirrored image's features are averaged in.
The batch axis is dynamic in the ONNX file (and in the traced TorchScript module).
The TorchScript module runs on the device it was exported on (MODEL.DEVICE).

After exporting, each file is loaded back (ONNX with onnxruntime when it is installed)
and run on a batch of a different size than the export batch; the largest absolute
difference to PyTorch is printed, and a difference above --atol is an error.
"""
import contextlib
import logging
import os
import re
import sys
import warnings
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402

from reid_engine.data import build_transforms  # noqa: E402
from reid_engine.engine.cli import build_config  # noqa: E402
from reid_engine.engine.defaults import default_argument_parser  # noqa: E402
from reid_engine.engine.inference_tools import (  # noqa: E402
    FeatureExtractor,
    ToolError,
    build_inference_model,
    inference_config,
    run_tool,
)
from reid_engine.utils.logger import setup_logger  # noqa: E402

PROG = "export"
FORMATS = ("torchscript", "onnx")
DEFAULT_OPSET = 17
logger = logging.getLogger("reid_engine.tools.export")


def build_parser():
    """`default_argument_parser()` plus the export flags."""
    parser = default_argument_parser(epilog=__doc__)
    parser.add_argument("--output", required=True, help="folder for model.pt (TorchScript) and model.onnx")
    parser.add_argument("--format", nargs="+", choices=FORMATS, default=list(FORMATS), help="what to export")
    parser.add_argument("--torchscript-mode", choices=("trace", "script"), default="trace",
                        help="trace (default; works for any model) or script (needs scriptable modules)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default {DEFAULT_OPSET})")
    parser.add_argument("--input-dtype", choices=("uint8", "float32"), default="uint8",
                        help="dtype of the exported input; values are 0..255 either way")
    parser.add_argument("--raw-features", action="store_true", help="output the features without L2 normalisation")
    parser.add_argument("--batch-size", type=int, default=2, help="batch size used to export")
    parser.add_argument("--check-batch-size", type=int, default=3,
                        help="batch size of the check (differs from --batch-size to test the dynamic axis)")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest accepted |export - PyTorch|")
    return parser


# --------------------------------------------------------------------------- inputs


def test_image_size(cfg) -> Tuple[int, int]:
    """(height, width) of the images the test transforms produce."""
    probe = build_transforms(cfg, is_train=False)(Image.new("RGB", (64, 128)))
    return int(probe.shape[1]), int(probe.shape[2])


def random_images(batch: int, size: Tuple[int, int], dtype: str, seed: int, device="cpu") -> torch.Tensor:
    """A reproducible batch of random 0..255 RGB images of the given dtype."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, 3, size[0], size[1]), generator=gen, dtype=torch.uint8)
    return images.to(device=device, dtype=getattr(torch, dtype))


# --------------------------------------------------------------------------- locating the culprit


def modules_using_op(module: nn.Module, example: torch.Tensor, op: str) -> List[str]:
    """Names of the sub-modules whose traced code calls `op` (e.g. "aten::cummax").

    Args:
        module: the module being exported.
        example: an input it accepts.
        op: the qualified operator name.
    Returns:
        dotted module names ("" = the top module), in graph order, without repeats.
    """
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = torch.jit.trace(module, (example,), check_trace=False).inlined_graph
    except Exception:  # the trace itself fails: nothing more to learn
        return []
    names: List[str] = []
    for node in graph.nodes():
        if node.kind() == op:
            # Scopes read "__module.a/__module.a.b": the last part is the innermost module.
            name = node.scopeName().split("/")[-1].replace("__module.", "", 1)
            name = "" if name == "__module" else name
            if name not in names:
                names.append(name)
    return names


def describe_module(root: nn.Module, name: str) -> str:
    """'name (ClassName)' for a sub-module of `root`."""
    module = root.get_submodule(name) if name else root
    return f"{name or '<top module>'} ({type(module).__name__})"


def first_unscriptable(module: nn.Module, name: str = "") -> str:
    """The deepest sub-module that torch.jit.script rejects while all its children compile.

    Args:
        module: a module that fails to script.
        name: its dotted name.
    Returns:
        the dotted name of the culprit.
    """
    for child_name, child in module.named_children():
        try:
            with _jit_deprecation_silenced():
                torch.jit.script(child)
        except Exception:
            return first_unscriptable(child, f"{name}.{child_name}" if name else child_name)
    return name


def _short_error(exc: BaseException) -> str:
    """The first line of an exporter error plus the source location it points at, if any."""
    text = str(exc).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    where = re.search(r'File "([^"]+)", line (\d+)', text)
    return first.rstrip(":") + (f" ({where.group(1)}, line {where.group(2)})" if where else "")


# --------------------------------------------------------------------------- exporting


@contextlib.contextmanager
def _jit_deprecation_silenced():
    """Hide torch's "torch.jit is deprecated" notices: TorchScript output is what was asked for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit", category=DeprecationWarning)
        yield


def export_torchscript(module: nn.Module, example: torch.Tensor, path: str, mode: str = "trace") -> str:
    """Trace or script `module` and save it.

    Raises:
        ToolError: scripting failed; the message names the module that cannot be scripted.
    """
    if mode == "script":
        try:
            with _jit_deprecation_silenced():
                exported = torch.jit.script(module)
        except Exception as e:
            culprit = describe_module(module, first_unscriptable(module))
            raise ToolError(f"TorchScript scripting failed in module {culprit}: {_short_error(e)}; "
                            "export with --torchscript-mode trace, or make that module scriptable") from None
    elif mode == "trace":
        with torch.no_grad(), _jit_deprecation_silenced():
            # Shape-dependent Python in the model only matters for other image sizes.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            exported = torch.jit.trace(module, (example,), check_trace=False)
    else:
        raise ToolError(f"unknown TorchScript mode {mode!r}; use trace or script")
    exported.save(path)
    return path


@contextlib.contextmanager
def _native_stdout_silenced():
    """Drop what C++ code writes to stdout (the ONNX exporter dumps its whole graph on errors)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def export_onnx(module: nn.Module, example: torch.Tensor, path: str, opset: int = DEFAULT_OPSET) -> str:
    """Export `module` to ONNX with a dynamic batch axis (inputs "images", outputs "features").

    Uses the TorchScript-based exporter (no dependency beyond torch).

    Raises:
        ToolError: an operator has no ONNX equivalent; the message names the operator,
            the module(s) that use it and what to try.
    """
    try:
        with torch.no_grad(), warnings.catch_warnings(), _native_stdout_silenced():
            warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notices
            torch.onnx.export(module, (example,), path, dynamo=False, opset_version=opset,
                              input_names=["images"], output_names=["features"],
                              dynamic_axes={"images": {0: "batch"}, "features": {0: "batch"}})
    except Exception as e:
        match = re.search(r"operator '([\w:.]+)'", str(e))
        if match is None:
            raise ToolError(f"ONNX export failed: {_short_error(e)}") from None
        op = match.group(1)
        users = [describe_module(module, n) for n in modules_using_op(module, example, op)]
        where = f"; it is used by {', '.join(users)}" if users else ""
        raise ToolError(f"ONNX export failed: operator {op} (opset {opset}) is not supported{where}; "
                        "replace that layer with supported operations or try another --opset") from None
    _check_onnx_graph(path)
    return path


def _check_onnx_graph(path: str) -> None:
    """Validate the ONNX graph with the onnx package's checker, when it is installed."""
    try:
        import onnx
    except ImportError:
        return
    onnx.checker.check_model(path)


# --------------------------------------------------------------------------- checking


def run_torchscript(path: str, images: torch.Tensor) -> np.ndarray:
    """Load a saved TorchScript module and run it on `images`."""
    with _jit_deprecation_silenced():
        loaded = torch.jit.load(path, map_location=images.device)
    with torch.no_grad():
        return loaded(images).float().cpu().numpy()


def run_onnx(path: str, images: torch.Tensor) -> Optional[np.ndarray]:
    """Run an ONNX file with onnxruntime; None (and a log line) when it is not installed."""
    try:
        import onnxruntime
    except ImportError:
        logger.info("onnxruntime is not installed: the ONNX file is not checked (pip install onnxruntime)")
        return None
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(["features"], {"images": images.cpu().numpy()})[0]


def export_model(cfg, output_dir: str, formats=FORMATS, torchscript_mode: str = "trace",
                 opset: int = DEFAULT_OPSET, input_dtype: str = "uint8", normalize: bool = True,
                 batch_size: int = 2, check_batch_size: int = 3, atol: float = 1e-4,
                 model: Optional[nn.Module] = None) -> Dict[str, dict]:
    """Export the model of `cfg` (with MODEL.WEIGHTS) and check every export.

    Args:
        cfg: the config.
        output_dir: folder for model.pt / model.onnx.
        formats: any of "torchscript", "onnx".
        torchscript_mode: "trace" or "script".
        opset: the ONNX opset.
        input_dtype: "uint8" or "float32".
        normalize: L2-normalised (True) or raw features.
        batch_size, check_batch_size: export and check batch sizes.
        atol: largest accepted absolute difference to PyTorch.
        model: an eval-mode model to export (default: built from `cfg` and MODEL.WEIGHTS).
    Returns:
        {format: {"path": file, "max_abs_diff": float or None (not checked)}}.
    Raises:
        ToolError: an export fails, or differs from PyTorch by more than `atol`.
    """
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ToolError(f"unknown export format(s) {unknown}; use {', '.join(FORMATS)}")
    if batch_size < 1 or check_batch_size < 1:
        raise ToolError("--batch-size and --check-batch-size must be at least 1")
    cfg = inference_config(cfg)
    model = model if model is not None else build_inference_model(cfg)
    module = FeatureExtractor(model, normalize=normalize, flip=cfg.TEST.FLIP.ENABLED).eval()
    device = module.model.device
    size = test_image_size(cfg)
    example = random_images(batch_size, size, input_dtype, seed=0, device=device)
    check = random_images(check_batch_size, size, input_dtype, seed=1, device=device)
    with torch.no_grad(), _exact_float32():
        reference = module(check).float().cpu().numpy()
    os.makedirs(output_dir, exist_ok=True)
    results: Dict[str, dict] = {}
    kind = "L2-normalised" if normalize else "raw"
    logger.info("Exporting %s: input (B, 3, %d, %d) %s 0..255, output (B, %d) %s features",
                type(module.model).__name__, size[0], size[1], input_dtype, reference.shape[1], kind)
    if "torchscript" in formats:
        path = export_torchscript(module, example, os.path.join(output_dir, "model.pt"), torchscript_mode)
        with _exact_float32():
            outputs = run_torchscript(path, check)
        results["torchscript"] = {"path": path, "max_abs_diff": _diff(reference, outputs)}
    if "onnx" in formats:
        path = export_onnx(module, example, os.path.join(output_dir, "model.onnx"), opset)
        outputs = run_onnx(path, check)
        results["onnx"] = {"path": path, "max_abs_diff": None if outputs is None else _diff(reference, outputs)}
    for name, result in results.items():
        diff = result["max_abs_diff"]
        shown = "not checked" if diff is None else f"{diff:.3g}"
        logger.info("%s: %s; max |difference| to PyTorch on %d images: %s",
                    name, result["path"], check_batch_size, shown)
        if diff is not None and diff > atol:
            raise ToolError(f"the {name} export differs from PyTorch by {diff:.3g} (> --atol {atol:g}); "
                            "the exported file is not reliable")
    return results


@contextlib.contextmanager
def _exact_float32():
    """Turn TF32 off on CUDA while computing check outputs: the exports run in full float32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _diff(reference: np.ndarray, outputs: np.ndarray) -> float:
    if outputs.shape != reference.shape:
        raise ToolError(f"exported model returned shape {outputs.shape}, PyTorch {reference.shape}")
    return float(np.abs(outputs.astype(np.float64) - reference).max())


def main(args) -> None:
    """Build the config, export and check."""
    export_model(build_config(args), args.output, args.format, args.torchscript_mode, args.opset,
                 args.input_dtype, not args.raw_features, args.batch_size, args.check_batch_size, args.atol)


if __name__ == "__main__":
    setup_logger()
    sys.exit(run_tool(PROG, main, build_parser().parse_args()))
