"""The OpenVINO back end: an exported OpenVINO IR file (.xml + .bin) as a drop-in for the PyTorch model.

`OpenVinoModel` compiles the file for the CPU with the OpenVINO runtime and runs it behind
the model interface of `exported_model.ExportedModel`, preprocessed as the file's
contract says (the rt_info section `reid_engine` that reid-export writes). OpenVINO
also reads an exported .onnx file directly: its contract then comes from the ONNX
metadata. openvino is optional; without it, using this back end is a one-line error.
"""
import os

import numpy as np

from ..reliability.signal_stack import preserved_signal_stack
from ..utils.errors import ReidUserError, first_line, require_module
from .contract import read_contract
from .exported_model import ExportedModel

__all__ = ["OpenVinoModel", "openvino_core"]


def openvino_core(purpose: str):
    """A new `openvino.Core`.

    Raises:
        MissingPackageError: openvino is not installed (one line: pip install openvino).
    """
    return require_module("openvino", purpose).Core()


class OpenVinoModel(ExportedModel):
    """An exported feature module (OpenVINO IR, or ONNX) run by OpenVINO on the CPU, with the model interface.

    Args:
        path: the .xml file written by reid-export (its .bin next to it), or a .onnx file.
        threads: inference threads (0: OpenVINO's default, one per core).

    Attributes:
        path: the file.
        contract: its `DeployContract`.
        compiled: the `openvino.CompiledModel`.
    Raises:
        MissingPackageError: openvino is not installed.
        ReidUserError: the file is missing or OpenVINO cannot load it.
        ContractError: the file carries no reid_engine contract.
    """

    def __init__(self, path: str, threads: int = 0):
        core = openvino_core(f"running {os.path.basename(path)} with the OpenVINO back end")
        if not os.path.isfile(path):
            raise ReidUserError(f"OpenVINO file {path} does not exist (MODEL.WEIGHTS): export one with "
                                "reid-export --format openvino")
        super().__init__(path, read_contract(path))
        # f32: on CPUs with bfloat16 units OpenVINO would otherwise compute float layers in
        # bfloat16, far from the PyTorch features; int8 layers of a quantized file stay int8.
        config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": int(threads)}
        try:
            with preserved_signal_stack():  # compiling installs a signal stack too small for Python's handlers
                self.compiled = core.compile_model(core.read_model(path), "CPU", config)
        except Exception as e:
            raise ReidUserError(f"OpenVINO cannot load {path} ({first_line(e)}): pass a .xml file (with its .bin) "
                                "written by reid-export") from None
        self._request = self.compiled.create_infer_request()
        self._output = self.compiled.output(self.contract.output_name)

    def run(self, images: np.ndarray) -> np.ndarray:
        """Run the model on a (B, 3, H, W) array of the contract's dtype; returns (B, D) float32."""
        return self._request.infer({self.contract.input_name: images})[self._output]
