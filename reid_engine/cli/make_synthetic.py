"""Write the SyntheticReID benchmark (and / or a contact sheet of samples) explicitly (`reid-make-synthetic`).

    reid-make-synthetic --root datasets                     # the default benchmark
    reid-make-synthetic --root /tmp/d --tiny                # SyntheticReIDTiny
    reid-make-synthetic --root datasets --shifted           # SyntheticReIDShifted (domain-shifted)
    reid-make-synthetic --contact-sheet /tmp/sheet.png --no-write
    reid-make-synthetic --root /tmp/d --train-ids 100 --test-ids 100 --force

The training code generates the default set by itself on first use; this command is for
writing it ahead of time, other sizes or difficulty settings, and for looking at samples.
"""
import argparse
import dataclasses
import logging
import time
from typing import List, Optional

from ..data.datasets import DEFAULT_SPEC, TINY_SPEC, ensure_synthetic_reid, resolve_data_root, write_contact_sheet
from ..data.synthetic import SHIFTED_SPEC, SHIFTED_TINY_SPEC
from ..utils.errors import ReidUserError, UsageError
from .base import command_parser
from .boundary import run_command

__all__ = ["PROG", "SPEC_OPTIONS", "build_parser", "build_spec", "run", "main"]

PROG = "reid-make-synthetic"

# command-line option -> SyntheticSpec field
SPEC_OPTIONS = {
    "train_ids": "num_train_ids", "test_ids": "num_test_ids", "cameras": "num_cameras",
    "distractors": "num_distractors", "palette_size": "palette_size",
    "occlusion_prob": "occlusion_prob", "noise": "noise", "cast_strength": "cast_strength",
    "blur": "blur", "seed": "seed",
}


def build_parser() -> argparse.ArgumentParser:
    """The shared base (no config) plus the size and difficulty options (default: the spec's values)."""
    parser = command_parser(PROG, __doc__, config=False)
    parser.add_argument("--root", default="", help="data root (default: $REID_DATASETS or ./datasets)")
    parser.add_argument("--tiny", action="store_true", help="start from the SyntheticReIDTiny settings and folder")
    parser.add_argument("--shifted", action="store_true",
                        help="start from SyntheticReIDShifted's settings and folder (with --tiny: SyntheticReIDShiftedTiny)")
    parser.add_argument("--folder", default="",
                        help="folder under the root (default: SyntheticReID[Shifted][Tiny] after --shifted / --tiny)")
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    parser.add_argument("--no-write", action="store_true", help="only write the contact sheet")
    parser.add_argument("--contact-sheet", default="",
                        help="write a PNG grid of samples here (rows = identities, cols = cameras)")
    parser.add_argument("--sheet-ids", type=int, default=12, help="rows of the contact sheet")
    for opt, field in SPEC_OPTIONS.items():
        kind = type(getattr(DEFAULT_SPEC, field))
        parser.add_argument("--" + opt.replace("_", "-"), dest=opt, type=kind, default=None,
                            help=f"SyntheticSpec.{field}")
    return parser


def build_spec(args: argparse.Namespace):
    """The SyntheticSpec of the options (the default or tiny spec with the given fields replaced).

    Raises:
        UsageError: the settings cannot make a valid benchmark (the message names the setting).
    """
    specs = {(False, False): DEFAULT_SPEC, (False, True): TINY_SPEC, (True, False): SHIFTED_SPEC,
             (True, True): SHIFTED_TINY_SPEC}
    spec = specs[bool(getattr(args, "shifted", False)), bool(args.tiny)]
    overrides = {field: getattr(args, opt) for opt, field in SPEC_OPTIONS.items() if getattr(args, opt) is not None}
    spec = dataclasses.replace(spec, **overrides)
    try:
        spec.validate()
    except ValueError as e:  # the spec's one-line message names the setting and its bounds
        if isinstance(e, ReidUserError):
            raise
        raise UsageError(str(e)) from e
    return spec


def run(args: argparse.Namespace) -> None:
    """Write the benchmark and / or the contact sheet."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = build_spec(args)
    if not args.no_write:
        folder = args.folder or ("SyntheticReID" + ("Shifted" if args.shifted else "") + ("Tiny" if args.tiny else ""))
        start = time.perf_counter()
        path = ensure_synthetic_reid(resolve_data_root(args.root), folder, spec, force=args.force)
        print(f"SyntheticReID ready at {path} ({time.perf_counter() - start:.1f} s)")
    if args.contact_sheet:
        write_contact_sheet(args.contact_sheet, spec, num_ids=args.sheet_ids)
        print(f"contact sheet written to {args.contact_sheet}")


def main(argv: Optional[List[str]] = None) -> int:
    """Run `reid-make-synthetic` with `argv` (default: sys.argv[1:]); returns the exit status."""
    return run_command(PROG, build_parser(), run, argv)
