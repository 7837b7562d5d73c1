"""Opening an exported .onnx file in ONNX Runtime, with one-line errors.

Its own module so that `contract` (which reads a file's metadata through a session when
onnx is not installed) and `onnx_runtime` (which runs the session) both import it one way.
"""
import os
from typing import Optional, Sequence

from ..utils.errors import ReidUserError, first_line, require_module

__all__ = ["onnx_session"]


def onnx_session(path: str, threads: int = 0, providers: Optional[Sequence[str]] = None):
    """An onnxruntime.InferenceSession of `path` (CPU by default).

    Args:
        path: the .onnx file.
        threads: intra-op threads (0: onnxruntime's default, one per core).
        providers: execution providers (default ["CPUExecutionProvider"]).
    Raises:
        MissingPackageError: onnxruntime is not installed (one line: pip install onnxruntime).
        ReidUserError: the file is missing or onnxruntime cannot load it.
    """
    ort = require_module("onnxruntime", f"running {os.path.basename(path)} with the ONNX Runtime back end")
    if not os.path.isfile(path):
        raise ReidUserError(f"ONNX file {path} does not exist (MODEL.WEIGHTS): export one with reid-export")
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads)
    options.log_severity_level = 3  # errors only: no per-node warnings on the console
    try:
        return ort.InferenceSession(path, options, providers=list(providers or ["CPUExecutionProvider"]))
    except Exception as e:
        raise ReidUserError(f"onnxruntime cannot load {path} ({first_line(e)}): pass a .onnx file written by "
                            "reid-export") from None
