"""OpenVINO IR export of a feature module and its int8 quantization with NNCF, verified on the test split.

The IR (model.xml + model.bin, float32 weights) is converted from the ONNX export with
OpenVINO's own reader (`openvino.Core.read_model`), and carries the preprocessing
contract in its rt_info (section `reid_engine`, one string entry per field, as in the
ONNX metadata), which `reid_engine.inference.read_contract` reads back.
`quantize_openvino` is NNCF post-training quantization (`nncf.quantize`: int8 weights
and activations, ranges calibrated on real images through the same test transforms as
the ONNX Runtime int8 path); `quantize_openvino_and_verify` keeps model_int8.xml only
when its mAP on the test split is close enough (`quantize.keep_if_accurate`).
openvino and nncf are optional: without them these paths fail in one line.
"""
import logging
import os
import tempfile
from typing import Dict, Optional

import torch
from torch import nn

from ..config import CfgNode
from ..inference import OpenVinoModel, contract_config
from ..inference.contract import RT_INFO_SECTION, DeployContract, read_contract
from ..reliability.signal_stack import preserved_signal_stack
from ..utils.errors import ReidUserError, first_line, require_module
from .exporters import DEFAULT_OPSET, ExportError, export_onnx
from .quantize import CalibrationBatches, calibration_paths, check_calibration_source, keep_if_accurate

__all__ = ["require_openvino", "write_openvino_ir", "export_openvino", "run_openvino", "quantize_openvino",
           "quantize_openvino_and_verify"]

logger = logging.getLogger(__name__)


def require_openvino(purpose: str = "the OpenVINO export (--format openvino)"):
    """The openvino module, or a one-line MissingPackageError naming the install command."""
    return require_module("openvino", purpose)


def write_openvino_ir(model, xml_path: str, contract: DeployContract) -> str:
    """Save an `openvino.Model` as IR (xml_path and the .bin beside it) with `contract` in its rt_info.

    The float weights are saved as they are (float32): compressing them to float16,
    OpenVINO's default, would move the features away from PyTorch's.
    """
    ov = require_openvino()
    rt_info = model.get_rt_info()
    if "framework" in rt_info:
        # The ONNX reader copies the ONNX metadata (an older copy of the contract) here; one
        # contract per file, the one that quantization updates.
        del rt_info["framework"]
    for key, value in contract.to_dict().items():
        model.set_rt_info(value, [RT_INFO_SECTION, key])
    ov.save_model(model, xml_path, compress_to_fp16=False)
    return xml_path


def export_openvino(module: nn.Module, example: torch.Tensor, xml_path: str, opset: int = DEFAULT_OPSET,
                    contract: Optional[DeployContract] = None, onnx_path: Optional[str] = None) -> str:
    """Write `module` as OpenVINO IR, converted from its ONNX export by OpenVINO's ONNX reader.

    Args:
        module, example, opset: as for `exporters.export_onnx` (used when `onnx_path` is None).
        xml_path: the .xml file to write (the .bin goes beside it).
        contract: the preprocessing contract to carry (default: the ONNX file's).
        onnx_path: an ONNX export of `module` already written (else a temporary one is).
    Raises:
        MissingPackageError: openvino is not installed.
        ExportError: the export or OpenVINO's conversion fails.
    """
    core = require_openvino().Core()
    with tempfile.TemporaryDirectory() as tmp:
        if onnx_path is None:
            onnx_path = export_onnx(module, example, os.path.join(tmp, "model.onnx"), opset, contract)
        contract = contract if contract is not None else read_contract(onnx_path)
        try:
            model = core.read_model(onnx_path)
        except Exception as e:
            raise ExportError(f"OpenVINO cannot convert the ONNX export: {first_line(e)}") from None
        return write_openvino_ir(model, xml_path, contract)


def _bin_path(xml_path: str) -> str:
    return os.path.splitext(xml_path)[0] + ".bin"


def _nncf():
    """The nncf module (its usage telemetry switched off: reid_engine sends nothing over the network)."""
    os.environ.setdefault("NNCF_CI", "1")  # the switch nncf reads, once, when it is first imported
    nncf = require_module("nncf", "OpenVINO int8 quantization (--format openvino --quantize int8)")
    nncf.set_log_level(logging.ERROR)  # its INFO lines repeat what the summary line says
    return nncf


def quantize_openvino(fp32_path: str, output_path: str, calibration: CalibrationBatches) -> str:
    """Write an int8 copy of an OpenVINO IR file with NNCF post-training quantization, contract updated.

    Args:
        fp32_path: the float .xml file (written by reid-export).
        output_path: the .xml file of the int8 model.
        calibration: the calibration images (one image per item: NNCF's per-sample statistics).
    Raises:
        MissingPackageError: openvino or nncf is not installed.
        ExportError: NNCF cannot quantize this model (one line).
    """
    nncf = _nncf()
    core = require_openvino("OpenVINO int8 quantization").Core()
    contract = read_contract(fp32_path)
    model = core.read_model(fp32_path)
    try:
        with preserved_signal_stack():  # NNCF compiles the model to collect statistics
            quantized = nncf.quantize(model, nncf.Dataset(calibration), subset_size=len(calibration.paths),
                                      preset=nncf.QuantizationPreset.PERFORMANCE)
    except Exception as e:
        raise ExportError(f"NNCF could not quantize {fp32_path}: {first_line(e)}") from None
    label = (f"int8 NNCF post-training (int8 weights and activations, ranges over {len(calibration.paths)} "
             "calibration images)")
    return write_openvino_ir(quantized, output_path, contract.replace(quantization=label))


def quantize_openvino_and_verify(cfg: CfgNode, fp32_path: str, calibration: str, calibration_size: int = 256,
                                 max_map_drop: float = 1.0, speed_batch: int = 32,
                                 speed_seconds: float = 2.0) -> Dict:
    """Quantize an OpenVINO IR file with NNCF, compare it with the float model on the test split, keep it if close.

    model_int8.xml / .bin are written next to the float file only when the int8 mAP is at
    most `max_map_drop` points below the float model's (`quantize.keep_if_accurate`).

    Args:
        cfg: the config (DATASETS.*, TEST.* of the evaluation).
        fp32_path: the exported float .xml file.
        calibration: an image folder or a split name.
        calibration_size: the most calibration images.
        max_map_drop: the largest accepted mAP drop, in points.
        speed_batch, speed_seconds: the CPU throughput figures.
    Returns:
        {"path", "fp32_map", "int8_map", "drop", "fp32_ips", "int8_ips"}.
    Raises:
        ExportError: the drop is above `max_map_drop` (the int8 files are not kept).
    """
    check_calibration_source("int8", calibration)
    fp32 = OpenVinoModel(fp32_path)
    paths = calibration_paths(cfg, calibration, calibration_size)
    logger.info("Calibrating OpenVINO int8 (NNCF) on %d images from %s", len(paths), calibration)
    reader = CalibrationBatches(paths, contract_config(cfg, fp32.contract), fp32.contract, batch_size=1)
    final = os.path.join(os.path.dirname(fp32_path) or ".", "model_int8.xml")
    pending = os.path.join(os.path.dirname(final), "model_int8.unverified.xml")
    files = {pending: final, _bin_path(pending): _bin_path(final)}
    return keep_if_accurate(cfg, fp32, lambda: OpenVinoModel(quantize_openvino(fp32_path, pending, reader)),
                            files, max_map_drop, speed_batch, speed_seconds)


def run_openvino(path: str, images: torch.Tensor):
    """Run an OpenVINO IR file on `images` (the export check); returns (B, D) float32 numpy."""
    try:
        return OpenVinoModel(path, threads=0).run(images.cpu().numpy())
    except ReidUserError as e:
        raise ExportError(f"the OpenVINO export does not run: {e}") from None
