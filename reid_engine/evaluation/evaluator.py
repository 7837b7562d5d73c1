"""The evaluator protocol, the inference loop, and result printing / checking."""
import datetime
import logging
import math
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Dict, List, Mapping, Optional, Sequence

import torch
from tabulate import tabulate
from torch.utils._pytree import tree_map_only

from reid_engine.runtime.compiled import is_compiled, kept_output, mark_step_begin
from reid_engine.utils import comm
from reid_engine.utils.errors import ReidUserError

__all__ = [
    "ExpectedResultsError",
    "log_result_checks",
    "parse_csv_format",
    "result_check_failures",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "flip_averaged",
    "inference_context",
    "inference_on_dataset",
    "print_csv_format",
    "verify_results",
]

logger = logging.getLogger(__name__)

# Seconds between progress lines of the inference loop.
_PROGRESS_PERIOD = 5
# Batches at the start that are left out of the speed figures (allocator, cudnn warm-up).
_WARMUP_BATCHES = 5


class DatasetEvaluator:
    """Base class of evaluators: ``reset()``, then ``process(inputs, outputs)`` per batch, then ``evaluate()``."""

    def reset(self) -> None:
        """Prepare for a new round of evaluation."""

    def process(self, inputs, outputs) -> None:
        """Accumulate one batch.

        Args:
            inputs: the batch dict given to the model.
            outputs: what the model returned for it.
        """

    def evaluate(self):
        """Return the results (a dict of floats, possibly nested), or None/{} on non-main ranks."""


class DatasetEvaluators(DatasetEvaluator):
    """Runs several evaluators as one; their result dicts are merged (names must not collide)."""

    def __init__(self, evaluators: Sequence[DatasetEvaluator]):
        """
        Args:
            evaluators: the evaluators to run.
        """
        super().__init__()
        self._evaluators = list(evaluators)

    def reset(self) -> None:
        """Reset every evaluator."""
        for evaluator in self._evaluators:
            evaluator.reset()

    def process(self, inputs, outputs) -> None:
        """Give the batch to every evaluator."""
        for evaluator in self._evaluators:
            evaluator.process(inputs, outputs)

    def evaluate(self):
        """Return the merged results of all evaluators (on the main process)."""
        results = OrderedDict()
        for evaluator in self._evaluators:
            result = evaluator.evaluate()
            if comm.is_main_process() and result is not None:
                for key, value in result.items():
                    if key in results:
                        raise KeyError(f"two evaluators both produced the result {key!r}; give them distinct names")
                    results[key] = value
        return results


@contextmanager
def inference_context(model: torch.nn.Module):
    """Put `model` in eval mode for the block and restore its previous mode afterwards, even on error."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _synchronize_device(model: torch.nn.Module) -> None:
    """Wait for queued CUDA work so that timings measure it."""
    if torch.cuda.is_available():
        try:
            device = next(model.parameters()).device
        except StopIteration:
            return
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def flip_averaged(model, inputs):
    """Mean of the features of a batch and of its horizontally mirrored copy (TEST.FLIP).

    Args:
        model: an eval-mode model returning (B, D) features.
        inputs: a (B, 3, H, W) image tensor (or (B, T, 3, H, W) tracklets), or a batch
            dict with "images"; the last dimension (width) is mirrored.
    Returns:
        the (B, D) features averaged over both orientations.
    """
    if isinstance(inputs, torch.Tensor):
        flipped = inputs.flip(-1)
    else:
        flipped = dict(inputs)
        flipped["images"] = inputs["images"].flip(-1)
    first = kept_output(model, model(inputs))  # CUDA graphs would overwrite it with the second call's
    mark_step_begin(model)
    return (first + model(flipped)) / 2


def _padded(inputs, size: int):
    """The batch with its last sample repeated up to `size` samples (tensors of the batch's length only)."""
    def pad(value):
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != length:
            return value
        return torch.cat([value, value[-1:].expand(size - length, *value.shape[1:])])

    length = int((inputs if isinstance(inputs, torch.Tensor) else inputs["images"]).shape[0])
    return pad(inputs) if isinstance(inputs, torch.Tensor) else {k: pad(v) for k, v in inputs.items()}


def _features(model, inputs, flip_test: bool, full_size: int) -> torch.Tensor:
    """The model's features of one evaluation batch.

    A compiled model gets every batch at the first batch's size: the last, partial batch is
    padded (its last image repeated) and the padding's features dropped. Evaluation is per
    image (BatchNorm uses its running statistics), so padding changes no feature, while a
    batch of another size would compile the model again (a dynamic shape) and, under CUDA
    graphs, record one more graph. Outputs are cloned where CUDA graphs would overwrite them.
    """
    size = int(inputs["images"].shape[0])
    padded = is_compiled(model) and size < full_size
    if padded:
        inputs = _padded(inputs, full_size)
    mark_step_begin(model)
    outputs = flip_averaged(model, inputs) if flip_test else model(inputs)

    def trim(tensor):  # also inside a custom model's tuple / dict outputs
        return kept_output(model, tensor[:size] if padded and tensor.dim() and tensor.shape[0] == full_size else tensor)

    return trim(outputs) if isinstance(outputs, torch.Tensor) else tree_map_only(torch.Tensor, trim, outputs)


def inference_on_dataset(model, data_loader, evaluator: Optional[DatasetEvaluator], flip_test: bool = False,
                         progress_label: str = "Inference done"):
    """Run `model` over `data_loader` and evaluate its outputs.

    The model runs in eval mode under ``torch.no_grad()``; its training mode is restored
    afterwards, also on error. Progress (images/s, ETA) is logged at most every few
    seconds; total and pure-compute times are logged at the end.

    Args:
        model: called as ``model(batch)``; returns (B, D) features.
        data_loader: iterable of batch dicts with "images" (B, 3, H, W).
        evaluator: receives ``process(inputs, outputs)``; None runs the model only.
        flip_test: average the features of each image and its mirror (TEST.FLIP).
        progress_label: the first words of the progress lines.

    Returns:
        ``evaluator.evaluate()`` (on the main process; None without an evaluator).
    """
    num_devices = comm.get_world_size()
    try:
        total = len(data_loader)
    except TypeError:
        total = None
    logger.info("Start inference on %s batches%s", total if total is not None else "?",
                " with flip test" if flip_test else "")
    if evaluator is not None:
        evaluator.reset()
    warmup = min(_WARMUP_BATCHES, total - 1) if total else 0
    images = full_size = 0
    start_time = time.perf_counter()
    timed_start, timed_images, compute_time = start_time, 0, 0.0
    with inference_context(model), torch.no_grad():
        last_progress = None
        for idx, inputs in enumerate(data_loader):
            if idx == warmup:
                timed_start, timed_images, compute_time = time.perf_counter(), 0, 0.0
            batch_size = int(inputs["images"].shape[0])
            full_size = max(full_size, batch_size)  # the first batch's, unless a later one is larger
            compute_start = time.perf_counter()
            outputs = _features(model, inputs, flip_test, full_size)
            _synchronize_device(model)
            compute_time += time.perf_counter() - compute_start
            if evaluator is not None:
                evaluator.process(inputs, outputs)
            images += batch_size
            timed_images += batch_size if idx >= warmup else 0
            elapsed = time.perf_counter() - timed_start
            if idx >= warmup and elapsed > 0 and timed_images:
                speed = timed_images / elapsed
                if total:
                    seconds_left = elapsed / (idx + 1 - warmup) * (total - idx - 1)
                    eta = str(datetime.timedelta(seconds=int(seconds_left)))
                    progress = f"{progress_label} {idx + 1}/{total} batches: {speed:.1f} images/s, ETA={eta}"
                else:
                    progress = f"{progress_label} {idx + 1} batches: {speed:.1f} images/s"
                # Throttled per run, not per call site: every run logs its first timed batch,
                # even right after another run (e.g. the pseudo-label extraction after an evaluation).
                now = time.perf_counter()
                if last_progress is None or now - last_progress >= _PROGRESS_PERIOD:
                    logger.info(progress)
                    last_progress = now
    total_time = time.perf_counter() - start_time
    timed = max(timed_images, 1)
    logger.info(
        "Total inference time: %s (%.6f s / img per device, on %d devices)",
        datetime.timedelta(seconds=int(total_time)), (time.perf_counter() - timed_start) / timed, num_devices,
    )
    logger.info(
        "Total inference pure compute time: %s (%.6f s / img per device, on %d devices)",
        datetime.timedelta(seconds=int(compute_time)), compute_time / timed, num_devices,
    )
    if evaluator is None:
        return None
    results = evaluator.evaluate()
    # An evaluator may return None on non-main processes; callers expect a dict.
    return {} if results is None else results


def _as_table_rows(results: Mapping):
    """Turn ``{dataset: {metric: value}}`` or a flat ``{metric: value}`` into (names, rows)."""
    if results and all(isinstance(v, Mapping) for v in results.values()):
        names = list(next(iter(results.values())).keys())
        rows = [[dataset] + [metrics.get(name, float("nan")) for name in names] for dataset, metrics in results.items()]
        return names, rows
    flat = dict(results)
    dataset = flat.pop("dataset", "results")
    return list(flat.keys()), [[dataset] + list(flat.values())]


def print_csv_format(results: Mapping) -> str:
    """Log results as a table and as machine-readable ``copypaste:`` lines.

    Args:
        results: ``{dataset: {metric: value}}`` (one row per dataset), or one dataset's
            flat ``{metric: value}`` (optionally with a "dataset" entry naming it).

    Returns:
        str: the table that was logged.
    """
    if not results:
        logger.info("No evaluation results to print")
        return ""
    names, rows = _as_table_rows(results)
    table = tabulate(rows, headers=["Dataset"] + names, tablefmt="pipe", floatfmt=".2f", numalign="left")
    logger.info("Evaluation results in csv format:\n%s", table)
    logger.info("copypaste: %s", ",".join(["Dataset"] + names))
    for row in rows:
        logger.info("copypaste: %s", ",".join([str(row[0])] + [f"{v:.4f}" if isinstance(v, float) else str(v) for v in row[1:]]))
    return table


def parse_csv_format(text: str) -> Dict[str, Dict[str, float]]:
    """Read back the last results that :func:`print_csv_format` logged (its ``copypaste:`` lines).

    Args:
        text: a log's text (e.g. a run's log.txt or captured console output).

    Returns:
        ``{dataset: {metric: value}}`` of the last header and the rows after it; empty when the
        text holds none.
    """
    names, results = None, {}
    for line in text.splitlines():
        if "copypaste:" not in line:
            continue
        fields = [field.strip() for field in line.split("copypaste:", 1)[1].split(",")]
        if fields[0] == "Dataset":
            names, results = fields[1:], {}
        elif names is not None:
            results[fields[0]] = {name: _number_or_text(value) for name, value in zip(names, fields[1:])}
    return results


def _number_or_text(value: str):
    try:
        return float(value)
    except ValueError:
        return value


class ExpectedResultsError(ReidUserError, RuntimeError):
    """TEST.EXPECTED_RESULTS was not met: the run's results are not what the config promised."""


def result_check_failures(cfg, results: Mapping) -> List[str]:
    """Compare results with ``TEST.EXPECTED_RESULTS`` ([[dataset, metric, value, tolerance], ...]).

    A value outside its tolerance (or NaN) is a failed check. A malformed entry, or a
    dataset/metric absent from the results, is a configuration mistake and raises ValueError.

    Args:
        cfg: config holding TEST.EXPECTED_RESULTS.
        results: ``{dataset: {metric: value}}``.

    Returns:
        one line per failed check, naming the metric, its value, the expected value, by how
        much it missed and the tolerance (empty when every expectation holds or there are none).
    """
    failures = []
    for entry in cfg.TEST.EXPECTED_RESULTS:
        if not isinstance(entry, (list, tuple)) or len(entry) != 4:
            raise ValueError(f"TEST.EXPECTED_RESULTS entry {entry!r} must be [dataset, metric, value, tolerance]")
        dataset, metric, value, tolerance = entry
        if dataset not in results:
            raise ValueError(f"TEST.EXPECTED_RESULTS names dataset {dataset!r} but results have {list(results)}")
        if metric not in results[dataset]:
            raise ValueError(f"TEST.EXPECTED_RESULTS names metric {metric!r} of {dataset!r} but results have "
                             f"{list(results[dataset])}")
        actual, value, tolerance = float(results[dataset][metric]), float(value), float(tolerance)
        if not math.isfinite(actual) or abs(actual - value) > tolerance:
            failures.append(f"{dataset} {metric} = {actual:.4f}, expected {value:.4f} +- {tolerance:.4f} "
                            f"(off by {abs(actual - value):.4f})")
    return failures


def log_result_checks(cfg, results: Mapping) -> List[str]:
    """Check results against ``TEST.EXPECTED_RESULTS`` and log every failed check as an error.

    Args:
        cfg: config holding TEST.EXPECTED_RESULTS.
        results: ``{dataset: {metric: value}}``.

    Returns:
        the failed checks, as :func:`result_check_failures` words them (empty: all hold).
    """
    failures = result_check_failures(cfg, results)
    for failure in failures:
        logger.error("Result check failed: %s", failure)
    if cfg.TEST.EXPECTED_RESULTS and not failures:
        logger.info("Results verification passed.")
    return failures


def verify_results(cfg, results: Mapping) -> bool:
    """Check results against ``TEST.EXPECTED_RESULTS``, logging every failed check.

    Returns:
        bool: True when every expectation holds (also when there are none); the exit code is
        the caller's (DefaultTrainer raises :class:`ExpectedResultsError`).
    """
    return not log_result_checks(cfg, results)
