"""The flag groups the command parsers are built from, and the classic training-script parser.

`base.command_parser` and `train.build_parser` assemble the commands from these groups;
`default_argument_parser` is the detectron2 / fast-reid style parser for your own scripts
(also importable as ``reid_engine.engine.default_argument_parser``).
"""
import argparse
import sys
from typing import Callable, Optional, Sequence

from ..engine.launch import DEFAULT_RENDEZVOUS_TIMEOUT_S

__all__ = [
    "add_config_arguments",
    "add_launch_arguments",
    "add_run_mode_arguments",
    "default_argument_parser",
    "positive_int",
    "comma_list",
]


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def comma_list(item_type: Callable[[str], object] = str, choices: Sequence = (), what: str = "value"):
    """argparse type: one value or a comma list of them (``a,b``), each converted by `item_type`.

    Use it with ``action="extend"`` instead of ``nargs="+"``: a flag then takes one word, so the KEY VALUE
    overrides that follow it are never read as its values, and repeating the flag adds more.

    Args:
        item_type: converts one item (str, int, ...).
        choices: the allowed items (empty: any).
        what: what an item is, for the error message.
    Returns:
        the type function, mapping the flag's word to a list.
    """
    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        try:
            values = [item_type(item) for item in items]
        except ValueError:
            values = None
        bad = [item for item in items if choices and item not in choices]
        if not items or values is None or bad:
            allowed = f" of {', '.join(map(str, choices))}" if choices else ""
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: use one or a comma list{allowed}")
        return values

    parse.__name__ = what  # argparse names the type in its messages
    return parse


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
