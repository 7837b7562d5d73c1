"""The training command line (`tools/train_net.py` and the `reid-train` entry point).

Parses `default_argument_parser()` flags, builds the config (file + KEY VALUE
overrides), then launches one worker per GPU or CPU process; each worker runs
`default_setup` and either evaluates MODEL.WEIGHTS (`--eval-only`) or trains with
`DefaultTrainer`.
"""
import logging
import sys
import traceback
from typing import List, Optional

import torch.multiprocessing as mp

from ..config import CfgNode, ConfigError, get_cfg
from ..utils.checkpoint import Checkpointer
from ..utils.env import resolve_device
from ..utils.errors import ReidUserError
from .defaults import DefaultTrainer, default_argument_parser, default_setup
from .inference_tools import inference_config
from .launch import launch

__all__ = ["build_config", "setup", "main", "run"]

logger = logging.getLogger(__name__)

# Errors whose message already says what is wrong and how to fix it: the command
# prints that one line instead of a traceback.
USER_ERRORS = (ReidUserError, FileNotFoundError, NotADirectoryError, FloatingPointError)


def build_config(args) -> CfgNode:
    """Build the frozen config from `--config-file` and the trailing KEY VALUE opts.

    Args:
        args: namespace from `default_argument_parser()`.
    Returns:
        the frozen CfgNode.
    """
    cfg = get_cfg()
    if args.config_file:
        cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts or [])
    cfg.freeze()
    return cfg


def setup(args) -> CfgNode:
    """Build the config and run `default_setup` (output dir, logs, seeds)."""
    cfg = build_config(args)
    default_setup(cfg, args)
    return cfg


def _eval_only(cfg: CfgNode):
    if not cfg.MODEL.WEIGHTS:
        raise ConfigError("--eval-only needs a checkpoint: add MODEL.WEIGHTS path/to/model.pth.")
    cfg = inference_config(cfg)  # no ImageNet weights; classifier sized like the checkpoint's
    model = DefaultTrainer.build_model(cfg)
    Checkpointer(model, save_dir=cfg.OUTPUT_DIR).load(cfg.MODEL.WEIGHTS, checkpointables=[])
    return DefaultTrainer.test(cfg, model)


def main(args):
    """One worker's job: setup, then evaluate or train.

    Args:
        args: namespace from `default_argument_parser()`.
    Returns:
        the evaluation results (main process) or None.
    """
    cfg = setup(args)
    if args.eval_only:
        return _eval_only(cfg)
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


def run(argv: Optional[List[str]] = None) -> int:
    """Parse the command line and launch the job; errors become one clear line.

    Args:
        argv: arguments (default: sys.argv[1:]).
    Returns:
        process exit code (0 on success).
    """
    args = default_argument_parser().parse_args(argv)
    try:
        cfg = build_config(args)  # fail fast, before any worker starts
        device = resolve_device(cfg.MODEL.DEVICE)
        launch(
            main,
            args.num_gpus,
            num_machines=args.num_machines,
            machine_rank=args.machine_rank,
            dist_url=args.dist_url,
            args=(args,),
            backend="nccl" if device.type == "cuda" else "gloo",
        )
    except USER_ERRORS as e:
        print(f"reid_engine: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except mp.ProcessRaisedException as e:
        # A worker failed: show its traceback, then the one-line summary.
        text = str(e).strip()
        print(text, file=sys.stderr)
        last = text.splitlines()[-1] if text else "a worker process failed"
        print(f"reid_engine: error: {_one_line(last.split(': ', 1)[-1])}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug rather than bad input: keep the traceback
        traceback.print_exc()
        print(f"reid_engine: error: {type(e).__name__}: {_one_line(str(e))}", file=sys.stderr)
        return 1
    return 0


def _one_line(message: str) -> str:
    return " ".join(message.split())


def console_main() -> None:
    """Entry point of the `reid-train` console script."""
    sys.exit(run())
