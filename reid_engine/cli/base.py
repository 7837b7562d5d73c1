"""What every command shares: the base of its parser, and building its config.

Every command accepts ``--debug``; commands that build a config accept ``--config-file``
and trailing ``KEY VALUE`` config overrides. Commands that start worker processes add the launch flags
(``--num-gpus``, ``--num-machines``, ``--machine-rank``, ``--dist-url``, ``--dist-timeout``). A command
adds only the flags it honours, so anything else is rejected by its parser (exit 2).
"""
import argparse

from ..config import CfgNode, get_cfg
from ..utils.errors import UsageError
from .args import add_config_arguments, add_launch_arguments, positive_int

__all__ = ["command_parser", "add_launch_arguments", "positive_int", "build_config", "launch_options"]


def command_parser(prog: str, doc: str, config: bool = True, launches: bool = False) -> argparse.ArgumentParser:
    """The parser base of a command: --debug, and --config-file with trailing opts (+ launch flags).

    Args:
        prog: the command's name (shown in usage and error lines).
        doc: the command module's docstring: first line = description, the rest = epilog.
        config: add --config-file and the trailing KEY VALUE opts (commands that build a config).
        launches: add the launch flags (commands that start worker processes).
    Returns:
        the parser; the command adds its own flags.
    """
    description, _, epilog = (doc or "").strip().partition("\n")
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog.strip() or None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error too (or set REID_DEBUG=1)")
    if launches:
        add_launch_arguments(parser)
    if config:
        add_config_arguments(parser)
    return parser


def launch_options(args: argparse.Namespace, device_type: str) -> dict:
    """Keyword arguments of `engine.launch` from the launch flags.

    Args:
        args: namespace of a parser with the launch flags.
        device_type: "cuda" or "cpu" (the backend follows it).
    Returns:
        {num_machines, machine_rank, dist_url, backend, rendezvous_timeout}.
    Raises:
        UsageError: --machine-rank outside 0 .. --num-machines - 1, or a --dist-timeout of 0 or less.
    """
    if not 0 <= args.machine_rank < args.num_machines:
        raise UsageError(f"--machine-rank {args.machine_rank} is out of range: use 0 .. {args.num_machines - 1} "
                         "(one less than --num-machines)")
    if not args.dist_timeout > 0:
        raise UsageError(f"--dist-timeout {args.dist_timeout:g} must be a positive number of seconds")
    return {"num_machines": args.num_machines, "machine_rank": args.machine_rank, "dist_url": args.dist_url,
            "backend": "nccl" if device_type == "cuda" else "gloo", "rendezvous_timeout": args.dist_timeout}


def build_config(args: argparse.Namespace) -> CfgNode:
    """Build the frozen config from `--config-file` and the trailing KEY VALUE opts.

    Args:
        args: namespace of a command parser.
    Returns:
        the frozen CfgNode.
    """
    cfg = get_cfg()
    if args.config_file:
        cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts or [])
    cfg.freeze()
    return cfg
