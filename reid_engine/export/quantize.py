"""int8 quantization of an exported ONNX model, verified on the test split.

Static quantization (`onnxruntime.quantization.quantize_static`: QDQ format, per-channel
int8 weights, uint8 activations with ranges calibrated on real images) needs calibration
images, fed through the same test transforms as evaluation (the file's contract).
Dynamic quantization (int8 weights, activation ranges computed at run time) needs none.
`quantize_and_verify` then evaluates both files with the ReID evaluator on the first test
set, times both on the CPU and keeps the int8 file only when its mAP drop is acceptable.
"""
import contextlib
import logging
import os
import re
import tempfile
import time
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np
import torch

from ..config import CfgNode
from ..data import build_reid_test_loader, build_transforms
from ..evaluation import ReidEvaluator, inference_on_dataset
from ..inference import SPLITS, ExportedModel, OnnxRuntimeModel, as_pil_image, collect_items, contract_config
from ..inference.contract import DeployContract, read_contract
from ..utils.errors import UsageError, first_line, require_module
from .exporters import ExportError, write_onnx_metadata

__all__ = ["QUANTIZE_MODES", "check_calibration_source", "calibration_paths", "CalibrationBatches", "quantize_onnx",
           "evaluate_on_test_set", "folded_root_warnings", "images_per_second", "keep_if_accurate", "quantize_and_verify"]

logger = logging.getLogger(__name__)

#: --quantize choices
QUANTIZE_MODES = ("int8", "dynamic")


def check_calibration_source(mode: str, calibration: str) -> None:
    """Static int8 quantization needs calibration images: fail in one line when none are named.

    Raises:
        UsageError: `mode` is "int8" and `calibration` is empty.
    """
    if mode == "int8" and not calibration:
        raise UsageError("--quantize int8 needs calibration images (--calibration): pass an image folder or a split "
                         f"({', '.join(SPLITS)}), or use --quantize dynamic")


def calibration_paths(cfg: CfgNode, source: str, count: int) -> List[str]:
    """Up to `count` calibration image paths, spread evenly over a folder or a dataset split.

    Args:
        cfg: the config (DATASETS.ROOT, DATASETS.TESTS[0] for a split).
        source: an image folder (searched recursively), or a split name (train, query, gallery).
        count: the most images to use.
    Raises:
        UsageError: `source` is neither an existing folder nor a split name.
    """
    if count < 1:
        raise UsageError(f"--calibration-size must be at least 1, got {count}")
    if os.path.isdir(source):
        items = collect_items(cfg, image_dir=source)
    elif source in SPLITS:
        items = collect_items(cfg, split=source)
    else:
        raise UsageError(f"--calibration {source} is neither a folder nor a split: pass an image folder or one of "
                         f"{', '.join(SPLITS)} (of DATASETS.TESTS[0])")
    picks = np.unique(np.linspace(0, len(items) - 1, num=min(count, len(items))).round().astype(int))
    return [items[i][0] for i in picks]


class CalibrationBatches:
    """An onnxruntime CalibrationDataReader over image files, preprocessed by the test transforms.

    It is also an iterable of the same {input name: batch} items (an NNCF calibration source).

    Args:
        paths: the calibration images.
        cfg: a config whose test transforms give the model's input (`contract_config`).
        contract: the model's contract (input name and dtype).
        batch_size: images per calibration batch.
    """

    def __init__(self, paths: List[str], cfg: CfgNode, contract: DeployContract, batch_size: int = 16):
        self.paths, self.contract, self.batch_size = list(paths), contract, int(batch_size)
        self.transforms = build_transforms(cfg, is_train=False)
        self._batches: Optional[Iterator[Dict[str, np.ndarray]]] = None

    def _generate(self) -> Iterator[Dict[str, np.ndarray]]:
        for start in range(0, len(self.paths), self.batch_size):
            images = [self.transforms(as_pil_image(p)) for p in self.paths[start:start + self.batch_size]]
            array = torch.stack(images).numpy().astype(self.contract.input_dtype, copy=False)
            yield {self.contract.input_name: array}

    def get_next(self) -> Optional[Dict[str, np.ndarray]]:
        """The next {input name: batch}, or None at the end."""
        if self._batches is None:
            self._batches = self._generate()
        return next(self._batches, None)

    def rewind(self) -> None:
        """Start again from the first batch."""
        self._batches = None

    def __iter__(self) -> Iterator[Dict[str, np.ndarray]]:
        return self._generate()

    def __len__(self) -> int:
        return -(-len(self.paths) // self.batch_size)


#: what the warnings onnxruntime's quantizer prints on the root logger mean, by their first words
_ROOT_WARNING_MEANINGS = {
    "Axis": "a 1-D weight, e.g. an InstanceNorm scale / shift of IBN blocks, has no channel axis: "
            "it is quantized per tensor instead of per channel",
    "Expected bias": "a convolution bias the exporter shares through an Identity node stays float32",
    "Please consider to run pre-processing": "onnxruntime's advice to run its pre-processing first: "
                                             "--quantize int8 does, dynamic needs none",
}


@contextlib.contextmanager
def folded_root_warnings(what: str = "onnxruntime quantization") -> Iterator[None]:
    """Fold the WARNING records logged on the root logger itself (onnxruntime's quantizer calls
    ``logging.warning``: dozens of lines for an IBN model) into one summary line of ours.

    The records are held back by a filter on the root logger (child loggers' records do not
    pass it, so reid_engine's own logging is untouched); a NullHandler keeps
    ``logging.warning`` from installing a console handler on a root logger without one.

    Args:
        what: the name of the folded source in the summary line.
    """
    folded: List[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING:
            folded.append(record)
            return False
        return True

    root = logging.getLogger()
    placeholder = logging.NullHandler() if not root.handlers else None
    if placeholder is not None:
        root.addHandler(placeholder)
    root.addFilter(hold)
    try:
        yield
    finally:
        root.removeFilter(hold)
        if placeholder is not None:
            root.removeHandler(placeholder)
    if folded:
        kinds: Dict[str, List[str]] = {}  # message with its quoted names blanked -> the messages
        for record in folded:
            message = record.getMessage()
            kinds.setdefault(re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", message), []).append(message)
        parts, known = [], True
        for messages in kinds.values():
            meaning = next((text for start, text in _ROOT_WARNING_MEANINGS.items() if messages[0].startswith(start)), "")
            known = known and bool(meaning)
            parts.append(f"{len(messages)}x {messages[0]!r}" + (f" ({meaning})" if meaning else ""))
        (logger.info if known else logger.warning)("%s: %d warning(s) folded into this line: %s", what, len(folded),
                                                   "; ".join(parts))


def quantize_onnx(fp32_path: str, output_path: str, mode: str = "int8",
                  calibration: Optional[CalibrationBatches] = None) -> str:
    """Write an int8 copy of an exported ONNX model, with its contract (quantization recorded).

    Args:
        fp32_path: the float model (written by reid-export).
        output_path: where the quantized model goes.
        mode: "int8" (static: QDQ, per-channel weights, calibrated activations) or "dynamic".
        calibration: the calibration batches (static mode).
    Raises:
        ExportError: onnxruntime cannot quantize this model (one line; try --quantize dynamic).
    """
    if mode not in QUANTIZE_MODES:
        raise UsageError(f"unknown quantization {mode!r} (--quantize): use {' or '.join(QUANTIZE_MODES)}")
    quantization = require_module("onnxruntime.quantization", "int8 quantization (--quantize)", "onnxruntime")
    contract = read_contract(fp32_path)  # the metadata only: no inference session is built for it
    with tempfile.TemporaryDirectory() as tmp, folded_root_warnings():
        try:
            if mode == "dynamic":
                quantization.quantize_dynamic(fp32_path, output_path, per_channel=True,
                                              weight_type=quantization.QuantType.QInt8)
                label = "int8 dynamic (per-channel int8 weights, activation ranges at run time)"
            else:
                if calibration is None:
                    raise UsageError("static int8 quantization needs calibration images (--calibration DIR|SPLIT), "
                                     "or use --quantize dynamic")
                prepared = os.path.join(tmp, "prepared.onnx")
                quantization.quant_pre_process(fp32_path, prepared, skip_symbolic_shape=True)
                quantization.quantize_static(
                    prepared, output_path, calibration, quant_format=quantization.QuantFormat.QDQ, per_channel=True,
                    activation_type=quantization.QuantType.QUInt8, weight_type=quantization.QuantType.QInt8,
                    calibrate_method=quantization.CalibrationMethod.MinMax)
                label = (f"int8 static QDQ (per-channel int8 weights, uint8 activations, MinMax over "
                         f"{len(calibration.paths)} calibration images)")
        except UsageError:
            raise
        except Exception as e:
            hint = "; try --quantize dynamic" if mode == "int8" else ""
            raise ExportError(f"onnxruntime could not quantize {fp32_path} ({mode}): {first_line(e)}{hint}") from None
    write_onnx_metadata(output_path, contract.replace(quantization=label).to_dict())
    return output_path


def evaluate_on_test_set(cfg: CfgNode, model, contract: Optional[DeployContract] = None,
                         label: str = "Evaluating") -> Dict[str, float]:
    """ReID metrics (mAP, Rank-1, ...) of a model on DATASETS.TESTS[0] with the ReID evaluator.

    Args:
        cfg: the config (DATASETS.*, TEST.*, INPUT.* of the test transforms).
        model: anything with the model interface (an eval-mode model, an `OnnxRuntimeModel`).
        contract: the contract of an exported model: its preprocessing replaces the
            config's, and flip averaging is left to the file (default: an
            `OnnxRuntimeModel`'s own contract; none for a PyTorch model).
        label: first words of the progress lines.
    """
    contract = contract if contract is not None else getattr(model, "contract", None)
    if contract is not None:
        cfg = contract_config(cfg, contract)
    loader, num_query = build_reid_test_loader(cfg, cfg.DATASETS.TESTS[0])
    return inference_on_dataset(model, loader, ReidEvaluator(cfg, num_query), flip_test=cfg.TEST.FLIP.ENABLED,
                                progress_label=label)


def images_per_second(run, images: np.ndarray, min_seconds: float = 2.0, warmup: int = 2) -> float:
    """Throughput of `run(images)` (best of repeated timed calls, at least `min_seconds` in all).

    Args:
        run: a callable taking the batch.
        images: the batch (its first axis is the batch size).
        min_seconds: time spent measuring.
        warmup: untimed calls first.
    Returns:
        images per second of the fastest call (the least disturbed by other processes).
    """
    for _ in range(warmup):
        run(images)
    best, spent = float("inf"), 0.0
    while spent < min_seconds:
        start = time.perf_counter()
        run(images)
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return len(images) / best


def quantize_and_verify(cfg: CfgNode, fp32_path: str, mode: str = "int8", calibration: str = "",
                        calibration_size: int = 256, max_map_drop: float = 1.0, speed_batch: int = 32,
                        speed_seconds: float = 2.0) -> Dict:
    """Quantize `fp32_path`, compare it with the float model on the test split, and keep it if good enough.

    The int8 file is written next to the float one as model_int8.onnx (model_dynamic.onnx
    for dynamic quantization) only when its mAP is at most `max_map_drop` points below
    the float model's; the float file is never changed.

    Args:
        cfg: the config (DATASETS.*, TEST.* of the evaluation).
        fp32_path: the exported float model.
        mode: "int8" (static) or "dynamic".
        calibration: an image folder or a split name (static mode).
        calibration_size: the most calibration images.
        max_map_drop: the largest accepted mAP drop, in points.
        speed_batch: batch size of the CPU throughput figures.
        speed_seconds: time spent timing each file.
    Returns:
        {"path", "fp32_map", "int8_map", "drop", "fp32_ips", "int8_ips"}.
    Raises:
        ExportError: the drop is above `max_map_drop` (the int8 file is not kept).
    """
    check_calibration_source(mode, calibration)
    fp32 = OnnxRuntimeModel(fp32_path)
    reader = None
    if mode == "int8":
        paths = calibration_paths(cfg, calibration, calibration_size)
        logger.info("Calibrating int8 activation ranges on %d images from %s", len(paths), calibration)
        reader = CalibrationBatches(paths, contract_config(cfg, fp32.contract), fp32.contract)
    final = os.path.join(os.path.dirname(fp32_path) or ".", "model_int8.onnx" if mode == "int8" else "model_dynamic.onnx")
    pending = final + ".unverified"
    return keep_if_accurate(cfg, fp32, lambda: OnnxRuntimeModel(quantize_onnx(fp32_path, pending, mode, reader)),
                            {pending: final}, max_map_drop, speed_batch, speed_seconds)


def keep_if_accurate(cfg: CfgNode, fp32: ExportedModel, quantize: Callable[[], ExportedModel],
                     files: Dict[str, str], max_map_drop: float = 1.0, speed_batch: int = 32,
                     speed_seconds: float = 2.0) -> Dict:
    """Quantize, compare the quantized model with the float one on the test split, keep its files if close enough.

    The evaluation and the decision of every int8 path (ONNX Runtime, OpenVINO): the
    quantized file(s) are written under pending names and renamed to their final names
    only when the mAP is at most `max_map_drop` points below the float model's; otherwise
    (or on any error) they are removed. The float file is never changed.

    Args:
        cfg: the config (DATASETS.*, TEST.* of the evaluation).
        fp32: the float model (an exported-model back end).
        quantize: writes the quantized file(s) at their pending paths and returns the model.
        files: {pending path: final path} of the quantized file(s); the first is the model.
        max_map_drop: the largest accepted mAP drop, in points.
        speed_batch: batch size of the CPU throughput figures.
        speed_seconds: time spent timing each file.
    Returns:
        {"path", "fp32_map", "int8_map", "drop", "fp32_ips", "int8_ips"}.
    Raises:
        ExportError: the quantized model gives non-finite features, or the drop is above
            `max_map_drop` (the quantized file is not kept).
    """
    final = next(iter(files.values()))
    try:
        quantized = quantize()
        models = {"fp32": fp32, "int8": quantized}
        shape = (speed_batch, 3, fp32.contract.input_height, fp32.contract.input_width)
        batch = np.random.default_rng(0).integers(0, 256, shape).astype(fp32.contract.input_dtype)
        if not np.isfinite(quantized.run(batch)).all():  # NaN features would rank, and compare, as anything
            raise ExportError(f"the int8 model of {fp32.path} returns non-finite features (NaN or inf); the int8 "
                              "file is not written, the fp32 file is kept: try the other runtime's int8")
        maps = {name: evaluate_on_test_set(cfg, model, label=f"Evaluating {name}")["mAP"] for name, model in models.items()}
        speeds = {name: images_per_second(model.run, batch, speed_seconds) for name, model in models.items()}
        drop = maps["fp32"] - maps["int8"]
        logger.info("%s on %s: mAP fp32 %.2f, int8 %.2f, drop %.2f points (--max-map-drop %g); CPU images/s at "
                    "batch %d: fp32 %.1f, int8 %.1f (%.2fx)", os.path.basename(final), cfg.DATASETS.TESTS[0],
                    maps["fp32"], maps["int8"], drop, max_map_drop, speed_batch, speeds["fp32"], speeds["int8"],
                    speeds["int8"] / speeds["fp32"])
        if not drop <= max_map_drop:  # a NaN mAP is refused too
            raise ExportError(f"int8 quantization drops mAP by {drop:.2f} points (fp32 {maps['fp32']:.2f}, "
                              f"int8 {maps['int8']:.2f}) > --max-map-drop {max_map_drop:g}; the int8 file is not "
                              f"written, {fp32.path} (fp32) is kept: calibrate on more images or raise --max-map-drop")
        for pending, target in files.items():
            os.replace(pending, target)
    finally:
        for pending in files:
            if os.path.exists(pending):
                os.remove(pending)
    logger.info("Wrote %s", final)
    return {"path": final, "fp32_map": maps["fp32"], "int8_map": maps["int8"], "drop": drop,
            "fp32_ips": speeds["fp32"], "int8_ips": speeds["int8"]}
