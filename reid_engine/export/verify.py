"""Export the model of a config and check every export against PyTorch."""
import contextlib
import copy
import logging
import os
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from ..config import CfgNode
from ..inference import FeatureExtractor, build_inference_model, inference_config
from ..inference.contract import contract_from_config, transform_sizes
from ..modeling.deploy import fuse_for_deploy, has_deploy_hooks
from ..utils.errors import ReidUserError, UsageError
from .boxmot import boxmot_contract, boxmot_images, export_boxmot
from .exporters import DEFAULT_OPSET, ExportError, export_onnx, export_torchscript, run_onnx, run_torchscript
from .openvino import export_openvino, require_openvino, run_openvino

__all__ = ["FORMATS", "DEFAULT_FORMATS", "input_image_size", "random_images", "export_model"]

logger = logging.getLogger(__name__)

FORMATS = ("torchscript", "onnx", "openvino", "boxmot")
#: what reid-export writes without --format (openvino is an optional package; boxmot a file for one client)
DEFAULT_FORMATS = ("torchscript", "onnx")


def input_image_size(cfg) -> Tuple[int, int]:
    """(height, width) of the images the test transforms produce."""
    return transform_sizes(cfg)[1]


def random_images(batch: int, size: Tuple[int, int], dtype: str, seed: int, device="cpu") -> torch.Tensor:
    """A reproducible batch of random 0..255 RGB images of the given dtype."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, 3, size[0], size[1]), generator=gen, dtype=torch.uint8)
    return images.to(device=device, dtype=getattr(torch, dtype))


def export_model(cfg: CfgNode, output_dir: str, formats=DEFAULT_FORMATS, torchscript_mode: str = "trace",
                 opset: int = DEFAULT_OPSET, input_dtype: str = "uint8", normalize: bool = True,
                 batch_size: int = 2, check_batch_size: int = 3, atol: float = 1e-4,
                 model: Optional[nn.Module] = None, fuse: bool = True, source_config: str = "") -> Dict[str, dict]:
    """Export the model of `cfg` (with MODEL.WEIGHTS) and check every export.

    With `fuse`, what is exported is a copy of the model in deploy form
    (`reid_engine.modeling.deploy.fuse_for_deploy`: RepVGG's branches folded into one conv
    per block); the checks compare the exports with the unfused model, so they cover the
    fusion too.

    Args:
        cfg: the config.
        output_dir: folder for model.pt / model.onnx / model.xml (OpenVINO IR, with model.bin).
        formats: any of "torchscript", "onnx", "openvino", "boxmot" (reid_engine_boxmot.onnx and
            its sidecar for BoxMOT's ONNX back end: `reid_engine.export.boxmot`).
        torchscript_mode: "trace" or "script".
        opset: the ONNX opset.
        input_dtype: "uint8" or "float32".
        normalize: L2-normalized (True) or raw features.
        batch_size, check_batch_size: export and check batch sizes.
        atol: largest accepted absolute difference to PyTorch.
        model: an eval-mode model to export (default: built from `cfg` and MODEL.WEIGHTS);
            it is not changed.
        fuse: export the deploy form (True) or the model as it is.
        source_config: the config file, recorded in the files' contract.
    Returns:
        {format: {"path": file, "max_abs_diff": float or None (not checked), "contract": DeployContract}};
        every file carries the contract (`reid_engine.inference.read_contract`).
    Raises:
        ExportError: an export fails, or differs from PyTorch by more than `atol`.
    """
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise UsageError(f"unknown export format(s) {unknown} (--format): use {', '.join(FORMATS)}")
    if batch_size < 1 or check_batch_size < 1:
        raise UsageError("batch sizes must be at least 1 (--batch-size, --check-batch-size): pass positive sizes")
    if "openvino" in formats:
        require_openvino()  # before anything is exported
    cfg = inference_config(cfg)
    model = model if model is not None else build_inference_model(cfg)
    unfused = FeatureExtractor(model, normalize=normalize, flip=cfg.TEST.FLIP.ENABLED).eval()
    device = model.device
    size = input_image_size(cfg)
    example = random_images(batch_size, size, input_dtype, seed=0, device=device)
    check = random_images(check_batch_size, size, input_dtype, seed=1, device=device)
    with torch.no_grad(), _exact_float32():
        reference = unfused(check).float().cpu().numpy()
    deployed = _deploy_form(model) if fuse else model
    module = FeatureExtractor(deployed, normalize=normalize, flip=cfg.TEST.FLIP.ENABLED).eval()
    contract = contract_from_config(cfg, reference.shape[1], input_dtype, normalize, source_config)
    os.makedirs(output_dir, exist_ok=True)
    results: Dict[str, dict] = {}
    kind = "L2-normalized" if normalize else "raw"
    logger.info("Exporting %s: input (B, 3, %d, %d) %s 0..255, output (B, %d) %s features",
                type(module.model).__name__, size[0], size[1], input_dtype, reference.shape[1], kind)
    if "torchscript" in formats:
        path = export_torchscript(module, example, os.path.join(output_dir, "model.pt"), torchscript_mode, contract)
        with _exact_float32():
            outputs = run_torchscript(path, check)
        results["torchscript"] = {"path": path, "max_abs_diff": _diff(reference, outputs), "contract": contract}
    if "onnx" in formats:
        path = export_onnx(module, example, os.path.join(output_dir, "model.onnx"), opset, contract)
        outputs = run_onnx(path, check)
        results["onnx"] = {"path": path, "max_abs_diff": None if outputs is None else _diff(reference, outputs),
                           "contract": contract}
    if "openvino" in formats:
        path = export_openvino(module, example, os.path.join(output_dir, "model.xml"), opset, contract,
                               onnx_path=results["onnx"]["path"] if "onnx" in results else None)
        results["openvino"] = {"path": path, "max_abs_diff": _diff(reference, run_openvino(path, check)),
                               "contract": contract}
    if "boxmot" in formats:  # BoxMOT's float input made of the same check images: the same reference
        contract_b = boxmot_contract(contract)
        logger.info("The boxmot file takes BoxMOT's input instead: (B, 3, %d, %d) float32 %s, normalized by the "
                    "client with mean %s / std %s", size[0], size[1], contract_b.value_range, contract_b.pixel_mean,
                    contract_b.pixel_std)
        path = export_boxmot(module, example, output_dir, opset, contract_b)
        outputs = run_onnx(path, boxmot_images(check))
        results["boxmot"] = {"path": path, "max_abs_diff": None if outputs is None else _diff(reference, outputs),
                             "contract": contract_b}
    for name, result in results.items():
        diff = result["max_abs_diff"]
        shown = "not checked" if diff is None else f"{diff:.3g}"
        logger.info("%s: %s; max |difference| to PyTorch on %d images: %s",
                    name, result["path"], check_batch_size, shown)
        if diff is not None and diff > atol:
            fused = " (of the model fused for deployment; --no-fuse exports it unfused)" if deployed is not model else ""
            raise ExportError(f"the {name} export{fused} differs from PyTorch by {diff:.3g} (> --atol {atol:g}); "
                            "the exported file is not reliable")
    return results


def _deploy_form(model: nn.Module) -> nn.Module:
    """A copy of `model` with its re-parameterisable blocks fused (`model` itself when it
    has none, or when they cannot be fused: then it is exported unfused, with a warning)."""
    if not has_deploy_hooks(model):
        return fuse_for_deploy(model)  # nothing changes; it logs that there was nothing to fuse
    try:
        return fuse_for_deploy(copy.deepcopy(model))
    except ReidUserError as e:
        logger.warning("Exporting the model unfused: %s", e)
        return model


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
        raise ExportError(f"exported model returned shape {outputs.shape}, PyTorch {reference.shape}")
    return float(np.abs(outputs.astype(np.float64) - reference).max())
