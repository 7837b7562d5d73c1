"""Run set-up: `default_setup` (config value check, output folder, loggers, config dump, seeds)
and the default event writers.

The argument parsing of the commands, `default_argument_parser` included, is in `reid_engine.cli.args`.
"""
import logging
import os
import time
from typing import Optional, Union

import torch

from ..config import CfgNode, warn_inert_keys
from ..integrations.event_writers import JSONWriter, TensorboardXWriter
from ..utils import comm
from ..utils.collect_env import collect_env_info
from ..utils.env import seed_all_rng
from ..utils.events import CommonMetricPrinter
from ..utils.file_io import atomic_write_text, ensure_writable_dir, ignore_file_size_signal, write_failure
from ..utils.logger import HIGHLIGHT, check_log_writes, setup_run_logging
from .config_checks import check_config_values

__all__ = ["default_setup", "default_writers"]

logger = logging.getLogger(__name__)


def default_setup(cfg: CfgNode, args, *, check: bool = True) -> None:
    """Prepare a run: config value check, output folder, loggers, environment log, config dump, seeds.

    An OUTPUT_DIR that cannot be created or written, or a log file that cannot take the
    set-up's lines (disk full, file size limit), fails here, before any model is built,
    with one line (:class:`~reid_engine.utils.file_io.FileWriteError`). SIGXFSZ is ignored,
    so that writes past the file size limit fail cleanly (EFBIG) instead of killing the process.

    Args:
        cfg: the full config (it is dumped to OUTPUT_DIR/config.yaml).
        args: the parsed command-line namespace (needs `config_file`, `eval_only`).
        check: run `check_config_values` first; False when the caller has checked this config already
            (`reid-train` checks it once, in the launching process, and hands it to the workers).
    """
    if check:
        check_config_values(cfg)  # a wrong name fails before OUTPUT_DIR is touched
    output_dir = cfg.OUTPUT_DIR
    if output_dir:  # every worker, so that all fail together (none waits for the others)
        ensure_writable_dir(output_dir, "OUTPUT_DIR")
    # A write beyond the file size limit (ulimit -f) then fails with EFBIG, a clean one-line
    # error that keeps the previous checkpoint, instead of killing the process.
    ignore_file_size_signal()
    comm.synchronize()
    rank = comm.get_rank()
    log = setup_run_logging(output_dir, distributed_rank=rank)

    log.info(f"Rank of current process: {rank}. World size: {comm.get_world_size()}")
    log.info("Environment info:\n" + collect_env_info())
    log.info("Command line arguments: " + str(args))
    config_file = getattr(args, "config_file", "")
    if config_file:
        with open(config_file, "r", encoding="utf-8") as f:
            language = "python" if config_file.endswith(".py") else "yaml"
            log.info(f"Contents of args.config_file={config_file}:\n{f.read()}", extra={HIGHLIGHT: language})
    log.info("Running with full config:\n" + cfg.dump(), extra={HIGHLIGHT: "yaml"})
    warn_inert_keys(cfg, log)
    if comm.is_main_process() and output_dir:
        path = os.path.join(output_dir, "config.yaml")
        _keep_previous_config(path, cfg.dump(), log)
        atomic_write_text(path, cfg.dump())
        log.info(f"Full config saved to {os.path.abspath(path)}")
    check_log_writes()  # a log that cannot be written stops the run now, not at its first step

    seed = cfg.SEED
    seed_all_rng(None if seed < 0 else seed + rank)
    if not getattr(args, "eval_only", False):
        torch.backends.cudnn.benchmark = cfg.CUDNN_BENCHMARK


def _keep_previous_config(path: str, new_text: str, log: logging.Logger) -> None:
    """Rename an earlier, different config.yaml aside so no run's record is lost."""
    if not os.path.isfile(path):
        return
    with open(path, "r", encoding="utf-8") as f:
        if f.read() == new_text:
            return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(path)))
    kept = os.path.join(os.path.dirname(path), f"config.{stamp}.yaml")
    os.replace(path, kept)
    log.info(f"The previous, different config of this folder is kept as {kept}")


def default_writers(output_dir: str, max_iter: Optional[int] = None, device: Union[str, torch.device] = "cpu") -> list:
    """The default event writers: console printer, metrics.json and tensorboard.

    Each writes whole records and fails with one line naming its file and the free space
    (:class:`~reid_engine.utils.file_io.FileWriteError`); the PeriodicWriter then stops the run.

    Args:
        output_dir: folder for metrics.json and the tensorboard event file.
        max_iter: total iterations (for the ETA).
        device: the training device (the console line shows peak memory on a GPU).
    Returns:
        list of EventWriter.
    """
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise write_failure(output_dir, e, "the output folder") from None
    return [
        CommonMetricPrinter(max_iter, device=device),
        JSONWriter(os.path.join(output_dir, "metrics.json")),
        TensorboardXWriter(output_dir),
    ]
