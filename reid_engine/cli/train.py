r"""Train a ReID model from a config file, or evaluate a checkpoint (`reid-train`).

    reid-train --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml
    reid-train --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --eval-only \
        MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth
    reid-train --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --eval-only \
        MODEL.WEIGHTS exported/model_int8.onnx                       # ONNX Runtime
    reid-train --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --resume
    reid-train --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --num-gpus 2 \
        MODEL.DEVICE cpu                                             # 2 CPU workers (gloo)
    torchrun --nproc-per-node 2 --max-restarts 3 tools/train_net.py \
        --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml   # auto-resumes

SIGTERM, SIGUSR1 or SIGINT: the run saves a checkpoint after the current step and exits with
status 143, logging the --resume command that continues it; a second signal stops it at once.

`python tools/train_net.py` is the same command. The config is built and checked in
this process before any worker starts; each worker then runs `default_setup` and
either evaluates MODEL.WEIGHTS (--eval-only) or trains with `DefaultTrainer`. An
exported .onnx file is evaluated with ONNX Runtime, preprocessed as its contract says,
by the same evaluator.
"""
import argparse
import logging
import os
import shlex
import sys
import time
from typing import Callable, List, Optional

from ..config import CfgNode, ConfigError
from ..engine.config_checks import check_config_values
from ..engine.defaults import DefaultTrainer, default_setup
from ..engine.launch import DEFAULT_RENDEZVOUS_TIMEOUT_S, launch, launched_by_torchelastic
from ..inference import contract_config, inference_config, load_exported_model, resolve_backend
from ..integrations.mlflow import log_run_summary
from ..reliability.preemption import TrainingPreempted
from ..runtime.run_plan import build_run_plan
from ..utils import comm
from ..utils.checkpoint import Checkpointer
from .args import add_run_mode_arguments
from .base import build_config, command_parser, launch_options
from .boundary import run_command
from .summary import DEFAULT_PROGRAM, format_run_summary, resume_command

__all__ = ["PROG", "build_parser", "setup", "train_worker", "run", "main"]

PROG = "reid-train"


def build_parser() -> argparse.ArgumentParser:
    """The shared base with the launch flags, plus --resume and --eval-only."""
    parser = command_parser(PROG, __doc__, launches=True)
    add_run_mode_arguments(parser)
    parser.add_argument("--auto-resume", action=argparse.BooleanOptionalAction, default=None,
                        help="resume from OUTPUT_DIR/last_checkpoint when there is one, like --resume; on by default "
                        "when torchrun (torchelastic) started the workers, so a restarted group continues by itself")
    return parser


def _checked_config(args: argparse.Namespace) -> CfgNode:
    """Build the frozen config from the command line and check its values (a wrong one is one error line)."""
    cfg = build_config(args)
    check_config_values(cfg)
    return cfg


def setup(args: argparse.Namespace, cfg: Optional[CfgNode] = None) -> CfgNode:
    """Run `default_setup` (output dir, logs, seeds) for the run's config.

    Args:
        args: namespace from `build_parser()`.
        cfg: the config, built and checked already (`run` does it); None builds and checks it here.
    Returns:
        the config.
    """
    cfg = _checked_config(args) if cfg is None else cfg
    default_setup(cfg, args, check=False)  # checked once, where it was built
    return cfg


def _eval_only(cfg: CfgNode):
    if not cfg.MODEL.WEIGHTS:
        raise ConfigError("--eval-only needs a checkpoint (MODEL.WEIGHTS): add MODEL.WEIGHTS path/to/model.pth")
    backend = resolve_backend(cfg.MODEL.WEIGHTS)
    if backend != "pytorch":  # an exported file (.onnx, OpenVINO .xml)
        model = load_exported_model(cfg.MODEL.WEIGHTS, backend)
        cfg = contract_config(cfg, model.contract)  # the file's input size; flip is inside it or off
    else:
        cfg = inference_config(cfg)  # no ImageNet weights; classifier sized like the checkpoint's
        # An evaluation pass: MODEL.COMPILE auto stays eager (no guard to fall back), an explicit mode is kept.
        model = DefaultTrainer.build_model(cfg, build_run_plan(cfg, purpose="evaluate"))
        Checkpointer(model, save_dir=cfg.OUTPUT_DIR).load(cfg.MODEL.WEIGHTS, checkpointables=[])
    results = DefaultTrainer.test(cfg, model, final=True)
    if cfg.TEST.EXPECTED_RESULTS and comm.is_main_process():
        DefaultTrainer.check_expected_results(cfg, results)  # a miss exits non-zero
    return results


def train_worker(args: argparse.Namespace, cfg: Optional[CfgNode] = None,
                 trainer_class: Callable[[CfgNode], DefaultTrainer] = DefaultTrainer, resume_with: str = ""):
    """One worker's job: setup, then evaluate or train.

    Args:
        args: namespace from `build_parser()`.
        cfg: the config the launching process built and checked; a spawned worker receives it
            pickled and builds nothing. None (a direct call) builds and checks it here.
        trainer_class: builds the trainer from the config (a DefaultTrainer subclass with more hooks,
            e.g. reid-tune's); evaluation (--eval-only) always uses DefaultTrainer.
        resume_with: how a stopped (preempted) run continues, for its message; "" = the --resume command.
    Returns:
        the evaluation results (main process) or None.
    """
    cfg = setup(args, cfg)
    if args.eval_only:
        return _eval_only(cfg)
    trainer = trainer_class(cfg)
    trainer.resume_or_load(resume=_resume_wanted(args))
    started = time.time()
    try:
        results = trainer.train()  # raises for a failed run: a summary only ends a completed one
    except TrainingPreempted as e:
        if resume_with:
            command = resume_with
        elif launched_by_torchelastic():  # the workers cannot restart the agent: its command is the one to repeat
            command = "the same torchrun command (it resumes from last_checkpoint by itself)"
        else:
            command = resume_command(_program(), args.config_file, args.opts or [], _launch_flags(args))
        stopped = TrainingPreempted.stopped(e.signum, e.iteration, e.checkpoint, resume=command)
        if comm.is_main_process():
            logging.getLogger(__name__).warning(str(stopped))
        raise stopped from None
    if comm.is_main_process():
        summary = format_run_summary(trainer.cfg, results, args.config_file, args.opts or [],
                                     program=_program(), launch_flags=_launch_flags(args),
                                     since=started - 1.0)  # file times can lag the clock a little
        logging.getLogger(__name__).info(summary)
        log_run_summary(trainer.cfg, summary)  # MLFLOW.ENABLED: summary.txt and the final log.txt
    return results


def _resume_wanted(args: argparse.Namespace) -> bool:
    """--resume, or --auto-resume (on by default when torchelastic started the workers)."""
    if args.resume:
        return True
    auto = args.auto_resume if args.auto_resume is not None else launched_by_torchelastic()
    if auto:
        logging.getLogger(__name__).info("Auto-resume%s: continuing from OUTPUT_DIR/last_checkpoint when there is one",
                                         "" if args.auto_resume else " (launched by torchelastic)")
    return bool(auto)


def _program() -> str:
    """How this command was invoked, for the commands the summary suggests."""
    invoked = sys.argv[0] if sys.argv else ""
    if os.path.basename(invoked) == PROG:
        return PROG
    if invoked.endswith("train_net.py"):
        return "python " + shlex.quote(invoked)
    return DEFAULT_PROGRAM  # called in-process (tests, notebooks): the documented script


def _launch_flags(args: argparse.Namespace) -> List[str]:
    """The launch flags the run was given that a follow-up command must repeat."""
    flags = ["--num-gpus", str(args.num_gpus)] if args.num_gpus != 1 else []
    if args.num_machines != 1:
        flags += ["--num-machines", str(args.num_machines), "--machine-rank", str(args.machine_rank)]
    if args.dist_url:
        flags += ["--dist-url", args.dist_url]
    if args.dist_timeout != DEFAULT_RENDEZVOUS_TIMEOUT_S:
        flags += ["--dist-timeout", f"{args.dist_timeout:g}"]
    return flags


def run(args: argparse.Namespace) -> None:
    """Build and check the config here, once (fail fast, before any worker starts), then launch the
    workers with it.

    Each launching process does this once: the one launcher of a machine (its workers receive the
    finished config), or each process that torchrun started (it is its own launcher).
    """
    cfg = _checked_config(args)  # one error line from this process, not one per worker
    device = build_run_plan(cfg, log=False).device  # the workers log the plan
    launch(train_worker, args.num_gpus, args=(args, cfg), **launch_options(args, device.type))


def main(argv: Optional[List[str]] = None) -> int:
    """Run `reid-train` with `argv` (default: sys.argv[1:]); returns the exit status.

    This is also the target of the `reid-train` console script.
    """
    return run_command(PROG, build_parser(), run, argv)
