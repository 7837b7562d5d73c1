"""What every back end of an exported model file shares: the model interface and the contract's config.

`ExportedModel` is an `nn.Module` with the model interface the inference code uses (a
batch dict or an image tensor in, (B, D) float32 features out, `.device`, eval / train),
so the predictor, `reid-extract` and the evaluation loop run an exported file unchanged.
It checks the input against the file's `DeployContract` and converts it to the
contract's dtype; a back end (`onnx_runtime.OnnxRuntimeModel`,
`openvino_runtime.OpenVinoModel`) opens the file and implements `run` on numpy arrays.
`contract_config` gives the config whose test transforms produce the contract's input.
"""
import logging
import os
from typing import Mapping

import numpy as np
import torch
from torch import nn

from ..config import CfgNode
from ..utils.errors import UsageError
from .contract import DeployContract

__all__ = ["ExportedModel", "contract_config"]

logger = logging.getLogger(__name__)


class ExportedModel(nn.Module):
    """An exported feature module run by some runtime, with the model interface.

    Args:
        path: the exported file.
        contract: its `DeployContract`.

    Attributes:
        path: the file.
        contract: its contract (input size, dtype, names).
    """

    def __init__(self, path: str, contract: DeployContract):
        super().__init__()
        self.path = path
        self.contract = contract
        self._dtype = np.dtype(contract.input_dtype)

    @property
    def device(self) -> torch.device:
        """Inputs are handed over as CPU arrays."""
        return torch.device("cpu")

    def run(self, images: np.ndarray) -> np.ndarray:
        """Run the file on a (B, 3, H, W) array of the contract's dtype; returns (B, D) float32."""
        raise NotImplementedError

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
        logger.info("INPUT.SIZE_TEST is %s as the exported file's contract says (the config had %s)",
                    list(configured.INPUT.SIZE_TEST), list(cfg.INPUT.SIZE_TEST))
    if cfg.TEST.FLIP.ENABLED != contract.flip_averaged:
        logger.warning("TEST.FLIP.ENABLED is %s but the exported file was made %s flip averaging; "
                       "the file's choice is used", cfg.TEST.FLIP.ENABLED,
                       "with" if contract.flip_averaged else "without")
    return configured
