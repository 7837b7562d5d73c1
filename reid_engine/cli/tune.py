"""Search hyperparameters with Optuna: each trial is one ordinary training run (`reid-tune`).

Examples:
    reid-tune --config-file configs/SyntheticReID/bagtricks_R18_tune.yml \\
        --search-space configs/tune/synthetic_demo.yml --n-trials 10
    # workers on several machines share one study on a database server
    reid-tune --config-file configs/SyntheticReID/bagtricks_R18_tune.yml \\
        --search-space configs/tune/synthetic_demo.yml --storage postgresql+psycopg://user:password@host/db
    # each trial on 2 workers; KEY VALUE pairs override the base config
    reid-tune --config-file configs/SyntheticReID/bagtricks_R18_tune.yml \\
        --search-space configs/tune/synthetic_demo.yml --num-gpus 2 MODEL.DEVICE cpu
    # the table, plots and best config so far
    reid-tune --summary --config-file configs/SyntheticReID/bagtricks_R18_tune.yml \\
        --search-space configs/tune/synthetic_demo.yml

The base config (--config-file and the KEY VALUE overrides) and the search space are checked
first: a problem is one error line before any trial. The study folder is
<OUTPUT_DIR>/<study name> (the study name defaults to the search-space file's name): the study
database (study.db, unless --storage names another), the log of the search, trials/trial_NNNN/
(one reid-train run each, with trial.json), and at the end summary.md, best_config.yaml and
the plots. Running the same command again, here or on another machine sharing the storage, adds
a worker to the same study: together the workers run --n-trials trials in all.

SIGTERM, SIGUSR1 or SIGINT: the running trial saves a checkpoint and the command exits with
status 143; the same command continues that trial from its checkpoint (so does any other
worker of the study). A worker killed outright (kill -9) leaves its trial running until its
heartbeat goes stale (3 x --heartbeat seconds); another worker then continues it.

`python tools/tune_net.py` is the same command. docs/tuning.md describes the search space.
"""
import argparse
import logging
import os
import shutil
from typing import List, Optional

from ..config import CfgNode
from ..engine.config_checks import check_config_values
from ..engine.launch import DEFAULT_RENDEZVOUS_TIMEOUT_S, launched_by_torchelastic
from ..runtime.run_plan import build_run_plan
from ..tune.results import BEST_CONFIG_FILE, PLOT_FILES, SUMMARY_FILE, write_summary
from ..tune.space import base_params, check_search_space, load_search_space
from ..tune.study import default_storage_url, open_storage, open_study, require_optuna, work_on_study
from ..tune.tracking import end_study_run, study_tracking_opts
from ..tune.trial_run import TrialBase, run_trial
from ..utils.errors import ReidUserError, UsageError
from ..utils.logger import setup_run_logging
from ..utils.urls import mask_password
from . import train
from .base import build_config, command_parser, launch_options, positive_int
from .boundary import run_command

__all__ = ["PROG", "build_parser", "run", "main"]

PROG = "reid-tune"

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The shared base with the launch flags (per trial), plus the search's flags."""
    parser = command_parser(PROG, __doc__)  # no --num-machines: a search spreads over machines by its workers
    parser.add_argument("--num-gpus", type=positive_int, default=1,
                        help="workers of each trial (GPUs, or CPU processes with MODEL.DEVICE cpu; default 1)")
    parser.add_argument("--dist-timeout", type=float, default=DEFAULT_RENDEZVOUS_TIMEOUT_S, metavar="SECONDS",
                        help=f"how long a trial's workers wait for each other (default {DEFAULT_RENDEZVOUS_TIMEOUT_S:g})")
    parser.add_argument("--search-space", required=True, metavar="FILE",
                        help="the search-space YAML file (objective, pruner, params; see docs/tuning.md)")
    parser.add_argument("--n-trials", type=positive_int, default=20,
                        help="trials of the study in all, however many workers run them (default 20)")
    parser.add_argument("--storage", default=None, metavar="URL",
                        help="the study database, e.g. postgresql+psycopg://user:password@host/db for workers on "
                        "several machines (default: SQLite, study.db in the study folder)")
    parser.add_argument("--study-name", default=None,
                        help="the study's name in the storage and its folder in OUTPUT_DIR "
                        "(default: the search-space file's name without extension)")
    parser.add_argument("--pruner", choices=("median", "hyperband", "none"), default=None,
                        help="stop unpromising trials at their periodic evaluations (default: the search space's "
                        "pruner, else median)")
    parser.add_argument("--sampler-seed", type=int, default=0, help="seed of the TPE sampler (default 0)")
    parser.add_argument("--heartbeat", type=float, default=60.0, metavar="SECONDS",
                        help="a running trial's heartbeat interval; a trial silent for 3 intervals (its worker was "
                        "killed) is continued by another worker (default 60)")
    parser.add_argument("--summary", action="store_true",
                        help="print the table of an existing study, write its plots and best config, and exit")
    return parser


def study_name_of(args: argparse.Namespace) -> str:
    """--study-name, else the search-space file's name without its extension."""
    return args.study_name or os.path.splitext(os.path.basename(args.search_space))[0]


def _base_train_args(args: argparse.Namespace) -> argparse.Namespace:
    """reid-train's arguments of the base command: config file, KEY VALUE opts and launch flags."""
    train_args = train.build_parser().parse_args(["--config-file", args.config_file])
    train_args.opts = list(args.opts or [])
    for flag in ("debug", "num_gpus", "dist_timeout"):
        setattr(train_args, flag, getattr(args, flag))
    train_args.dist_url = "auto" if args.num_gpus > 1 else None  # a fresh local port for each trial's workers
    return train_args


def _check_launch(args: argparse.Namespace) -> None:
    """reid-tune starts each trial's workers itself, on this machine."""
    if launched_by_torchelastic() or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        raise UsageError("reid-tune starts the workers of each trial itself: run it directly (with --num-gpus), "
                         "not under torchrun")


def _summary(args: argparse.Namespace, cfg: CfgNode, space, study_dir: str, storage_url: str) -> int:
    """--summary: write and print the summary of an existing study."""
    optuna = require_optuna()
    name = study_name_of(args)
    if args.storage is None and not os.path.isfile(os.path.join(study_dir, "study.db")):
        raise UsageError(f"no study {name} in {study_dir} (no study.db): run reid-tune without --summary first, or "
                         "name its storage with --storage and its name with --study-name")
    storage = open_storage(storage_url, args.heartbeat)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise UsageError(f"no study {name} in the storage {mask_password(storage_url)}: check --study-name "
                         "(default: the search-space file's name) and --storage") from None
    print(write_summary(study, space, cfg, study_dir))
    return 0


def run(args: argparse.Namespace) -> int:
    """Check the base config and the search space, then work on the study until all its trials
    have finished, and print its summary.

    Each reid-tune process is one worker of the study: it claims the next waiting trial, trains
    it (``tune.trial_run.run_trial``), and goes on until none is left.
    """
    require_optuna()  # the one install hint, before anything else
    _check_launch(args)
    cfg = build_config(args)
    check_config_values(cfg)  # one error line before any trial
    space = load_search_space(args.search_space)
    check_search_space(space, cfg)
    name = study_name_of(args)
    study_dir = os.path.abspath(os.path.join(cfg.OUTPUT_DIR, name))
    storage_url = args.storage or default_storage_url(study_dir)
    if args.summary:
        return _summary(args, cfg, space, study_dir, storage_url)
    if not args.heartbeat > 0:
        raise UsageError(f"--heartbeat {args.heartbeat:g} must be a positive number of seconds")

    created = not os.path.isdir(study_dir)
    try:  # a rejected storage leaves no study folder behind
        storage = open_storage(storage_url, args.heartbeat)
        study = open_study(storage, name, space, args.n_trials, args.sampler_seed, base_params(space, cfg),
                           args.pruner or space.pruner)
    except ReidUserError:
        if created and os.path.isdir(study_dir):
            shutil.rmtree(study_dir, ignore_errors=True)
        raise
    log_file = os.path.join(study_dir, "log.txt")
    setup_run_logging(log_file)
    shown_url = mask_password(storage_url)
    logger.info("Study %s: storage %s, folder %s (trials in %s)", name, shown_url, study_dir,
                os.path.join(study_dir, "trials"))
    if storage_url.startswith("sqlite"):
        logger.info("More workers: run the same command again on this machine (SQLite needs a local disk); for "
                    "several machines use a database server, --storage postgresql+psycopg://...")
    else:
        logger.info("More workers: run the same command on another machine with --storage %s, the same config, "
                    "search space and --n-trials (trial folders must be on a disk all of them share)", shown_url)

    device = build_run_plan(cfg, log=False).device
    train_args = _base_train_args(args)
    tracking = study_tracking_opts(study, cfg, study_dir, space)  # MLFLOW.ENABLED: trials nest in the study's run
    trial_cfg = cfg  # the base config of every trial; best_config.yaml is written from `cfg`, without the study's run
    if tracking:
        train_args.opts += tracking
        trial_cfg = cfg.clone()
        trial_cfg.defrost()
        trial_cfg.merge_from_list(tracking)
        trial_cfg.freeze()
    base = TrialBase(args=train_args, cfg=trial_cfg, launch_options=launch_options(train_args, device.type),
                     train_worker=train.train_worker, storage_url=storage_url, heartbeat_s=args.heartbeat,
                     log_file=log_file)
    work_on_study(study, lambda trial: run_trial(trial, space, base, study_dir), storage, storage_url, log=logger)
    try:
        text = write_summary(study, space, cfg, study_dir)
    except ReidUserError as e:  # the trials are done and recorded: a summary that fails is one warning
        logger.warning("Could not write the study's summary: %s (retry with --summary)", e)
        return 0
    end_study_run(study, cfg, study_dir, [SUMMARY_FILE, BEST_CONFIG_FILE, *PLOT_FILES])
    print(text)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Run `reid-tune` with `argv` (default: sys.argv[1:]); returns the exit status.

    This is also the target of the `reid-tune` console script.
    """
    return run_command(PROG, build_parser(), run, argv)
