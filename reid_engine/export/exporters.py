"""Writing and running TorchScript and ONNX files of a feature module."""
import contextlib
import logging
import os
import re
import sys
import warnings
from typing import Mapping, Optional

import numpy as np
import torch
from torch import nn

from ..inference.contract import CONTRACT_FILE, DeployContract
from ..utils.errors import ReidUserError, UsageError, require_module
from .diagnostics import describe_module, first_unscriptable, jit_deprecation_silenced, modules_using_op, short_error

__all__ = ["DEFAULT_OPSET", "ExportError", "export_torchscript", "export_onnx", "run_torchscript", "run_onnx",
           "write_onnx_metadata"]

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 17


class ExportError(ReidUserError, RuntimeError):
    """An export failed or does not match PyTorch; the message names the layer or the difference."""


def export_torchscript(module: nn.Module, example: torch.Tensor, path: str, mode: str = "trace",
                       contract: Optional[DeployContract] = None) -> str:
    """Trace or script `module` and save it, with `contract` as the extra file reid_engine_contract.json.

    Raises:
        ExportError: scripting failed; the message names the module that cannot be scripted.
    """
    if mode == "script":
        try:
            with jit_deprecation_silenced():
                exported = torch.jit.script(module)
        except Exception as e:
            culprit = describe_module(module, first_unscriptable(module))
            raise ExportError(f"TorchScript scripting failed in module {culprit}: {short_error(e)}; "
                            "export with --torchscript-mode trace, or make that module scriptable") from None
    elif mode == "trace":
        with torch.no_grad(), jit_deprecation_silenced():
            # Shape-dependent Python in the model only matters for other image sizes.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            exported = torch.jit.trace(module, (example,), check_trace=False)
    else:
        raise UsageError(f"unknown TorchScript mode {mode!r} (--torchscript-mode): use trace or script")
    extra = {CONTRACT_FILE: contract.to_json()} if contract is not None else {}
    exported.save(path, _extra_files=extra)
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


def export_onnx(module: nn.Module, example: torch.Tensor, path: str, opset: int = DEFAULT_OPSET,
                contract: Optional[DeployContract] = None) -> str:
    """Export `module` to ONNX with a dynamic batch axis (inputs "images", outputs "features").

    Uses the TorchScript-based exporter; `contract` goes into the file's metadata_props
    (which needs the onnx package).

    Raises:
        ExportError: an operator has no ONNX equivalent; the message names the operator,
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
            raise ExportError(f"ONNX export failed: {short_error(e)}") from None
        op = match.group(1)
        users = [describe_module(module, n) for n in modules_using_op(module, example, op)]
        where = f"; it is used by {', '.join(users)}" if users else ""
        raise ExportError(f"ONNX export failed: operator {op} (opset {opset}) is not supported{where}; "
                        "replace that layer with supported operations or try another --opset") from None
    if contract is not None:
        write_onnx_metadata(path, contract.to_dict())
    _check_onnx_graph(path)
    return path


def write_onnx_metadata(path: str, entries: Mapping[str, str]) -> None:
    """Set string entries of an ONNX file's metadata_props (replacing those of the same keys), in place."""
    onnx = require_module("onnx", "writing the preprocessing contract into the ONNX file", "onnx")
    model = onnx.load(path)
    kept = [(p.key, p.value) for p in model.metadata_props if p.key not in entries]
    del model.metadata_props[:]
    for key, value in kept + sorted(entries.items()):
        model.metadata_props.add(key=key, value=str(value))
    onnx.save(model, path)


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
    with jit_deprecation_silenced():
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
