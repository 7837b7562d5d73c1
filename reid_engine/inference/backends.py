"""The inference back ends, picked by name or by the extension of MODEL.WEIGHTS.

"pytorch" runs a .pth checkpoint; "onnxruntime" (`onnx_runtime.OnnxRuntimeModel`) an
exported .onnx file; "openvino" (`openvino_runtime.OpenVinoModel`) an exported OpenVINO
IR .xml file (or a .onnx file). `load_exported_model` opens an exported file with its
back end.
"""
import os
from typing import Optional

from ..utils.errors import UsageError
from .exported_model import ExportedModel
from .onnx_runtime import OnnxRuntimeModel
from .openvino_runtime import OpenVinoModel

__all__ = ["BACKENDS", "resolve_backend", "load_exported_model"]

#: the inference back ends (--backend)
BACKENDS = ("pytorch", "onnxruntime", "openvino")

#: extension -> (back end by default, what the file is)
_EXPORTED_FILES = {".onnx": ("onnxruntime", "an ONNX file"), ".xml": ("openvino", "an OpenVINO IR file")}


def resolve_backend(weights: str, backend: Optional[str] = None) -> str:
    """The back end for MODEL.WEIGHTS: `backend` when given, else from the extension (.onnx, .xml, else pytorch).

    Raises:
        UsageError: an unknown back end, or a file that the named back end cannot load
            (an exported file given to pytorch, an OpenVINO IR file given to onnxruntime).
    """
    extension = os.path.splitext(str(weights).lower())[1]
    default, kind = _EXPORTED_FILES.get(extension, ("pytorch", "a checkpoint"))
    if backend in (None, "", "auto"):
        return default
    if backend not in BACKENDS:
        raise UsageError(f"unknown back end {backend!r} (--backend): use {', '.join(BACKENDS)}")
    if (backend == "pytorch" and default != "pytorch") or (backend == "onnxruntime" and default == "openvino"):
        raise UsageError(f"MODEL.WEIGHTS {weights} is {kind}, which the {backend} back end cannot load: "
                         f"use --backend {default}, or pass {'the .pth checkpoint' if backend == 'pytorch' else 'a .onnx file'}")
    return backend


def load_exported_model(path: str, backend: str, threads: int = 0) -> ExportedModel:
    """An exported file as a model, run by `backend` ("onnxruntime" or "openvino") on the CPU.

    Args:
        path: the exported file.
        backend: the back end (see `resolve_backend`).
        threads: intra-op threads (0: the runtime's default, one per core).
    """
    if backend == "onnxruntime":
        return OnnxRuntimeModel(path, threads)
    if backend == "openvino":
        return OpenVinoModel(path, threads)
    raise UsageError(f"{backend!r} does not run exported files: use onnxruntime or openvino")
