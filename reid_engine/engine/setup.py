"""Run set-up shared by the commands: the classic argument parser, `default_setup`
(output folder, loggers, config dump, seeds) and the default event writers."""
import argparse
import logging
import os
import sys
import time
from typing import Optional, Union

import torch

from ..config import CfgNode, warn_inert_keys
from ..utils import comm
from ..utils.collect_env import collect_env_info
from ..utils.env import seed_all_rng
from ..utils.events import CommonMetricPrinter, JSONWriter, TensorboardXWriter
from ..utils.file_io import atomic_write_text, ensure_writable_dir, ignore_file_size_signal
from ..utils.logger import HIGHLIGHT, setup_logger
from .config_checks import check_config_values
from .launch import DEFAULT_RENDEZVOUS_TIMEOUT_S

__all__ = [
    "add_config_arguments",
    "add_launch_arguments",
    "add_run_mode_arguments",
    "default_argument_parser",
    "default_setup",
    "default_writers",
    "positive_int",
]

logger = logging.getLogger(__name__)


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --config-file and the trailing KEY VALUE config overrides (`opts`)."""
    parser.add_argument("--config-file", default="", metavar="FILE", help="path to the config file")
    parser.add_argument("opts", default=None, nargs=argparse.REMAINDER,
                        help="config overrides as KEY VALUE pairs, e.g. SOLVER.BASE_LR 0.01 MODEL.DEVICE cpu")


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags of `engine.launch`: workers per machine, machines, this machine's rank, rendezvous
    address and timeout."""
    parser.add_argument("--num-gpus", type=positive_int, default=1,
                        help="workers per machine (GPUs, or CPU processes with MODEL.DEVICE cpu)")
    parser.add_argument("--num-machines", type=positive_int, default=1, help="total number of machines")
    parser.add_argument("--machine-rank", type=int, default=0, help="rank of this machine (0 .. num-machines - 1)")
    parser.add_argument("--dist-url", default=None,
                        help="rendezvous URL, e.g. tcp://host:port; 'auto' picks a free local port (one machine "
                        "only); default: a local port derived from the user id")
    parser.add_argument("--dist-timeout", type=float, default=DEFAULT_RENDEZVOUS_TIMEOUT_S, metavar="SECONDS",
                        help="how long the workers wait for each other to join before one error line names the "
                        f"address and the missing ranks (default {DEFAULT_RENDEZVOUS_TIMEOUT_S:g})")


def add_run_mode_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --resume and --eval-only, the two modes of a training script."""
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUTPUT_DIR/last_checkpoint when it exists (MODEL.WEIGHTS is then ignored)")
    parser.add_argument("--eval-only", action="store_true", help="only evaluate MODEL.WEIGHTS")


def default_argument_parser(epilog: Optional[str] = None) -> argparse.ArgumentParser:
    """Build the classic parser of a training script (detectron2 / fast-reid style), for your own scripts.

    `reid-train` builds its parser from the same pieces (see `reid_engine.cli`).

    Args:
        epilog: text shown at the end of `--help`.
    Returns:
        argparse.ArgumentParser with --config-file, --resume, --eval-only,
        --num-gpus, --num-machines, --machine-rank, --dist-url, --dist-timeout and trailing `opts`.
    """
    epilog = epilog or (
        "Examples:\n"
        f"  {sys.argv[0]} --config-file cfg.yml --num-gpus 8\n"
        f"  {sys.argv[0]} --config-file cfg.yml --eval-only MODEL.WEIGHTS output/model_final.pth\n"
        f"  {sys.argv[0]} --config-file cfg.yml --resume\n"
        f"  {sys.argv[0]} --config-file cfg.yml --num-gpus 2 MODEL.DEVICE cpu   # 2 CPU workers (gloo)\n"
    )
    parser = argparse.ArgumentParser(epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_mode_arguments(parser)
    add_launch_arguments(parser)
    add_config_arguments(parser)
    return parser


def default_setup(cfg: CfgNode, args) -> None:
    """Prepare a run: config value check, output folder, loggers, environment log, config dump, seeds.

    An OUTPUT_DIR that cannot be created or written fails here, before any model is built,
    with one line (:class:`~reid_engine.utils.file_io.FileWriteError`). SIGXFSZ is ignored,
    so that writes past the file size limit fail cleanly (EFBIG) instead of killing the process.

    Args:
        cfg: the full config (it is dumped to OUTPUT_DIR/config.yaml).
        args: the parsed command-line namespace (needs `config_file`, `eval_only`).
    """
    check_config_values(cfg)  # a wrong name fails before OUTPUT_DIR is touched
    output_dir = cfg.OUTPUT_DIR
    if output_dir:  # every worker, so that all fail together (none waits for the others)
        ensure_writable_dir(output_dir, "OUTPUT_DIR")
    # A write beyond the file size limit (ulimit -f) then fails with EFBIG, a clean one-line
    # error that keeps the previous checkpoint, instead of killing the process.
    ignore_file_size_signal()
    comm.synchronize()
    rank = comm.get_rank()
    setup_logger(output_dir, distributed_rank=rank, name="fvcore")
    log = setup_logger(output_dir, distributed_rank=rank)

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

    Args:
        output_dir: folder for metrics.json and the tensorboard event file.
        max_iter: total iterations (for the ETA).
        device: the training device (the console line shows peak memory on a GPU).
    Returns:
        list of EventWriter.
    """
    os.makedirs(output_dir, exist_ok=True)
    return [
        CommonMetricPrinter(max_iter, device=device),
        JSONWriter(os.path.join(output_dir, "metrics.json")),
        TensorboardXWriter(output_dir),
    ]
