"""TorchScript, ONNX and OpenVINO IR export of a trained model, checked against PyTorch;
also an ONNX file for BoxMOT's appearance back end (`boxmot`).

What is exported is the inference model as one module
(`reid_engine.inference.FeatureExtractor`): input "images", a (B, 3, H, W) RGB batch
with values 0..255 (uint8 by default, float32 on request) at the test size; output
"features", (B, D) float32, L2-normalized by default. The batch axis is dynamic.
`export_model` fuses re-parameterisable blocks (RepVGG) into their deploy form, writes
the files and runs each on a batch of another size, comparing with the unfused PyTorch
model. Every file carries its preprocessing contract (`reid_engine.inference.DeployContract`:
ONNX metadata_props, OpenVINO rt_info, a TorchScript extra file). `quantize_and_verify`
(ONNX Runtime) and `quantize_openvino_and_verify` (NNCF) write an int8 copy of the ONNX /
OpenVINO file and keep it only when its mAP on the test split is close enough.
Layering: above data, modeling, evaluation and inference; never imports engine.
"""
from .diagnostics import describe_module, first_unscriptable, modules_using_op
from .exporters import (
    DEFAULT_OPSET,
    ExportError,
    export_onnx,
    export_torchscript,
    run_onnx,
    run_torchscript,
    write_onnx_metadata,
)
from .openvino import export_openvino, quantize_openvino, quantize_openvino_and_verify, run_openvino
from .quantize import (
    QUANTIZE_MODES,
    CalibrationBatches,
    calibration_paths,
    check_calibration_source,
    evaluate_on_test_set,
    images_per_second,
    keep_if_accurate,
    quantize_and_verify,
    quantize_onnx,
)
from .verify import DEFAULT_FORMATS, FORMATS, export_model, input_image_size, random_images

__all__ = [
    "QUANTIZE_MODES",
    "CalibrationBatches",
    "calibration_paths",
    "check_calibration_source",
    "evaluate_on_test_set",
    "images_per_second",
    "keep_if_accurate",
    "quantize_and_verify",
    "quantize_onnx",
    "write_onnx_metadata",
    "DEFAULT_FORMATS",
    "DEFAULT_OPSET",
    "ExportError",
    "FORMATS",
    "describe_module",
    "export_model",
    "export_onnx",
    "export_openvino",
    "export_torchscript",
    "first_unscriptable",
    "input_image_size",
    "modules_using_op",
    "quantize_openvino",
    "quantize_openvino_and_verify",
    "random_images",
    "run_onnx",
    "run_openvino",
    "run_torchscript",
]
