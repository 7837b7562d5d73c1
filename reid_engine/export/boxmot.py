"""An ONNX file that BoxMOT's ONNX appearance back end loads as it is (`reid-export --format boxmot`).

BoxMOT (boxmot 25) feeds an ONNX ReID model float32 NCHW crops: BGR frame crops resized
bilinearly (OpenCV) to the graph's input size, turned RGB, divided by 255, minus the
ImageNet mean, over the ImageNet std. It reads the sidecar file
``<weights>.metadata.json`` (``model_name``, ``img_size``, ``preprocess``,
``model_kwargs``), guesses the architecture from the file name when the sidecar names
none, and takes a fixed input size declared by the graph as authoritative.

So the BoxMOT file is the plain export's feature module behind `BoxmotInput`, which
undoes the ImageNet normalisation inside the graph (x * 255 * std + 255 * mean gives the
0..255 values back), after which the model applies its own MODEL.PIXEL_MEAN / STD as
always: a model trained with other statistics gets exactly the input it was trained on.
The graph keeps a static H x W (only the batch axis is dynamic), the file is named
`BOXMOT_FILE` (no BoxMOT architecture name in it) and the sidecar says the rest.

BoxMOT's ONNX back end pip-installs the ONNX Runtime it pins (``onnxruntime==1.24.3`` on a CPU)
into the running environment the first time it loads a model where another version is
installed, and offers no switch to stop it. requirements.txt pins that version, and
`require_boxmot_runtime` lets a process refuse to load a model where BoxMOT would install it.
"""
import json
import logging
import os
from typing import Sequence

import torch
from torch import nn

from ..inference.contract import DeployContract, pixel_stats_text
from ..utils.errors import MissingPackageError
from ..utils.file_io import atomic_write_text
from .exporters import export_onnx

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "BOXMOT_FILE", "BOXMOT_MODEL_NAME", "BoxmotInput", "boxmot_contract",
           "boxmot_images", "sidecar_path", "write_boxmot_sidecar", "export_boxmot", "require_boxmot_runtime"]

logger = logging.getLogger(__name__)

#: the statistics BoxMOT normalises every crop with (RGB, 0..1 units)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: contains none of BoxMOT's architecture names (osnet, resnet50, lmbn, ...) nor "veri"
#: / "vehicleid", which would make it assume another input size
BOXMOT_FILE = "reid_engine_boxmot.onnx"
#: the sidecar's model_name: not a BoxMOT architecture, so it builds nothing from it
BOXMOT_MODEL_NAME = "reid_engine"
# boxmot.reid.core.artifacts: MODEL_KWARGS_SCHEMA_VERSION / ARTIFACT_METADATA_SCHEMA_VERSION
_SCHEMA_VERSION = 1


def _channels(values: Sequence[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).view(1, 3, 1, 1)


class BoxmotInput(nn.Module):
    """A feature module that takes BoxMOT's ImageNet-normalised float input.

    Args:
        features: a module mapping (B, 3, H, W) RGB 0..255 images to features
            (`reid_engine.inference.FeatureExtractor`, which normalises with the model's
            own MODEL.PIXEL_MEAN / STD).
    """

    def __init__(self, features: nn.Module):
        super().__init__()
        self.features = features
        self.train(features.training)
        # (x * std + mean) * 255: BoxMOT's (v / 255 - mean) / std solved for v
        self.register_buffer("scale", _channels(IMAGENET_STD) * 255.0, persistent=False)
        self.register_buffer("shift", _channels(IMAGENET_MEAN) * 255.0, persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images * self.scale + self.shift)


def boxmot_images(images: torch.Tensor) -> torch.Tensor:
    """What BoxMOT feeds for RGB 0..255 `images` (any dtype): float32 (x / 255 - mean) / std."""
    mean, std = _channels(IMAGENET_MEAN).to(images.device), _channels(IMAGENET_STD).to(images.device)
    return (images.float() / 255.0 - mean) / std


def boxmot_contract(contract: DeployContract) -> DeployContract:
    """The contract of the BoxMOT file exported beside the plain file of `contract`.

    Float32 0..1 input normalised outside the graph with ImageNet's mean and std, resized
    bilinearly straight to the input size (BoxMOT does not center-crop).
    """
    if (contract.resize_height, contract.resize_width) != (contract.input_height, contract.input_width):
        logger.warning("The test transforms resize to %dx%d and center-crop to %dx%d; BoxMOT resizes its crops "
                       "straight to %dx%d, so its features will differ a little from reid-extract's",
                       contract.resize_height, contract.resize_width, contract.input_height, contract.input_width,
                       contract.input_height, contract.input_width)
    return contract.replace(input_dtype="float32", value_range="0..1", normalization="outside",
                            pixel_mean=pixel_stats_text(IMAGENET_MEAN), pixel_std=pixel_stats_text(IMAGENET_STD),
                            interpolation="bilinear",
                            resize_height=contract.input_height, resize_width=contract.input_width)


def sidecar_path(path: str) -> str:
    """BoxMOT's metadata file of the weights file `path`: ``<path>.metadata.json``."""
    return path + ".metadata.json"


def write_boxmot_sidecar(path: str, contract: DeployContract) -> str:
    """Write the ``<path>.metadata.json`` that BoxMOT reads for the weights file `path`; returns its path.

    ``model_kwargs.img_size`` is the input size BoxMOT resizes crops to (the graph's static
    size says the same); ``preprocess`` "resize" is its plain bilinear resize.
    """
    size = [contract.input_height, contract.input_width]
    metadata = {
        "schema_version": _SCHEMA_VERSION,
        "model_name": BOXMOT_MODEL_NAME,
        "img_size": size,
        "preprocess": "resize",
        "model_kwargs_schema_version": _SCHEMA_VERSION,
        "model_kwargs": {"img_size": size},
        "feature_dim": contract.feature_dim,
        "producer": f"reid_engine {contract.reid_engine_version}",
        "source_checkpoint": contract.source_checkpoint,
        "source_checkpoint_sha256": contract.source_checkpoint_sha256,
    }
    target = sidecar_path(path)
    atomic_write_text(target, json.dumps(metadata, indent=1, sort_keys=True))
    return target


def export_boxmot(features: nn.Module, example: torch.Tensor, output_dir: str, opset: int,
                  contract: DeployContract) -> str:
    """Write `BOXMOT_FILE` and its sidecar into `output_dir`; returns the ONNX file's path.

    Args:
        features: the eval-mode feature module of the plain export (RGB 0..255 input).
        example: an RGB 0..255 example batch at the input size (any dtype).
        output_dir: the folder.
        opset: the ONNX opset.
        contract: this file's contract (`boxmot_contract` of the plain export's).
    """
    module = BoxmotInput(features).to(example.device).eval()
    path = export_onnx(module, boxmot_images(example), os.path.join(output_dir, BOXMOT_FILE), opset, contract)
    write_boxmot_sidecar(path, contract)
    return path


def require_boxmot_runtime(device: str = "cpu") -> None:
    """Check that BoxMOT's ONNX back end will find the runtime it accepts, so it installs nothing.

    Args:
        device: the device BoxMOT is given (its CUDA runtime is another package).
    Raises:
        MissingPackageError: BoxMOT would pip-install its runtime into this environment on loading a
            model; the message names the requirement to install first.
    """
    from importlib.metadata import PackageNotFoundError, version

    from boxmot.reid.backends.dependencies import reid_backend_requirements
    from boxmot.utils.checks import requirement_satisfied

    requirements = reid_backend_requirements("onnx", device=device)
    if any(requirement_satisfied(requirement) for requirement in requirements):
        return
    try:
        installed = f"onnxruntime {version('onnxruntime')} is installed"
    except PackageNotFoundError:
        installed = "onnxruntime is not installed"
    raise MissingPackageError(f"BoxMOT's ONNX back end accepts only {' or '.join(requirements)} and would pip-install "
                              f"it into this environment on loading the model ({installed}): "
                              f"pip install '{requirements[0]}' (requirements.txt)")
