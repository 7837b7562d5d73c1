"""The ONNX Runtime back end: an exported .onnx file as a drop-in for the PyTorch model.

`OnnxRuntimeModel` runs an `onnxruntime.InferenceSession` behind the model interface of
`exported_model.ExportedModel` (batch dict or image tensor in, (B, D) features out), so
the predictor, `reid-extract` and the evaluation loop run it unchanged. Its
preprocessing comes from the file's contract (`contract.DeployContract.configure`): the
same test transforms as the PyTorch path. onnxruntime is optional; without it, using
this back end is a one-line error.
"""
from typing import Optional, Sequence

import numpy as np

from .contract import DeployContract
from .exported_model import ExportedModel
from .ort_session import onnx_session

__all__ = ["OnnxRuntimeModel", "onnx_session"]


class OnnxRuntimeModel(ExportedModel):
    """An exported ONNX feature module run by ONNX Runtime, with the model interface.

    Args:
        path: the .onnx file (written by reid-export: it carries its contract).
        threads, providers: see `ort_session.onnx_session`.

    Attributes:
        path: the file.
        contract: its `DeployContract`.
        session: the onnxruntime session.
    """

    def __init__(self, path: str, threads: int = 0, providers: Optional[Sequence[str]] = None):
        session = onnx_session(path, threads, providers)
        super().__init__(path, DeployContract.from_dict(session.get_modelmeta().custom_metadata_map, source=path))
        self.session = session

    def run(self, images: np.ndarray) -> np.ndarray:
        """Run the session on a (B, 3, H, W) array of the contract's dtype; returns (B, D) float32."""
        return self.session.run([self.contract.output_name], {self.contract.input_name: images})[0]
