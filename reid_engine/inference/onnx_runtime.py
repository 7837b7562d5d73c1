"""The ONNX Runtime back end: an exported .onnx file as a drop-in for the PyTorch model.

`OnnxRuntimeModel` wraps an `onnxruntime.InferenceSession` in an `nn.Module` with the
model interface the inference code uses (batch dict or image tensor in, (B, D) features
out, `.device`, eval / train), so the predictor, `reid-extract` and the evaluation loop
run it unchanged. Its preprocessing comes from the file's contract
(`contract.DeployContract.configure`): the same test transforms as the PyTorch path.
onnxruntime is optional; without it, using this back end is a one-line error.
"""
import logging
import os
from typing import Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..config import CfgNode
from ..utils.errors import UsageError
from .contract import DeployContract
from .ort_session import onnx_session

__all__ = ["BACKENDS", "OnnxRuntimeModel", "resolve_backend", "onnx_session", "contract_config"]

logger = logging.getLogger(__name__)

#: the inference back ends (--backend)
BACKENDS = ("pytorch", "onnxruntime")


def resolve_backend(weights: str, backend: Optional[str] = None) -> str:
    """The back end for MODEL.WEIGHTS: `backend` when given, else onnxruntime for a .onnx file.

    Raises:
        UsageError: an unknown back end, or a .onnx file given to the PyTorch back end.
    """
    if backend in (None, "", "auto"):
        return "onnxruntime" if str(weights).lower().endswith(".onnx") else "pytorch"
    if backend not in BACKENDS:
        raise UsageError(f"unknown back end {backend!r} (--backend): use {' or '.join(BACKENDS)}")
    if backend == "pytorch" and str(weights).lower().endswith(".onnx"):
        raise UsageError(f"MODEL.WEIGHTS {weights} is an ONNX file, which the pytorch back end cannot load: "
                         "use --backend onnxruntime, or pass the .pth checkpoint")
    return backend


class OnnxRuntimeModel(nn.Module):
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
        super().__init__()
        self.path = path
        self.session = onnx_session(path, threads, providers)
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.contract = DeployContract.from_dict(metadata, source=path)
        self._dtype = np.dtype(self.contract.input_dtype)

    @property
    def device(self) -> torch.device:
        """Inputs are handed over as CPU arrays."""
        return torch.device("cpu")

    def run(self, images: np.ndarray) -> np.ndarray:
        """Run the session on a (B, 3, H, W) array of the contract's dtype; returns (B, D) float32."""
        return self.session.run([self.contract.output_name], {self.contract.input_name: images})[0]

    def forward(self, batch) -> torch.Tensor:
        """(B, D) float32 CPU features of a batch dict with "images", or of the image tensor itself."""
        images = batch["images"] if isinstance(batch, Mapping) else batch
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise UsageError(f"{os.path.basename(self.path)} takes (B, 3, H, W) image batches, got {shape}: "
                             "tracklets need the PyTorch back end")
        expected = (self.contract.input_height, self.contract.input_width)
        if tuple(images.shape[2:]) != expected:
            raise UsageError(f"images of {tuple(images.shape[2:])} given to {os.path.basename(self.path)}, "
                             f"which takes {expected} (height, width): preprocess with its contract")
        array = images.detach().cpu()
        if self._dtype == np.uint8 and array.dtype != torch.uint8:
            array = array.round().clamp(0, 255).to(torch.uint8)
        return torch.from_numpy(self.run(array.numpy().astype(self._dtype, copy=False)))


def contract_config(cfg: CfgNode, contract: DeployContract) -> CfgNode:
    """`contract.configure(cfg)`, logging what the file changes in the config."""
    configured = contract.configure(cfg)
    if list(configured.INPUT.SIZE_TEST) != list(cfg.INPUT.SIZE_TEST):
        logger.info("INPUT.SIZE_TEST is %s as the ONNX file's contract says (the config had %s)",
                    list(configured.INPUT.SIZE_TEST), list(cfg.INPUT.SIZE_TEST))
    if cfg.TEST.FLIP.ENABLED != contract.flip_averaged:
        logger.warning("TEST.FLIP.ENABLED is %s but the ONNX file was exported %s flip averaging; "
                       "the file's choice is used", cfg.TEST.FLIP.ENABLED, "with" if contract.flip_averaged else "without")
    return configured
