#!/usr/bin/env python
"""Write the SyntheticReID benchmark (and / or a contact sheet of samples) explicitly.

    python tools/make_synthetic.py --root datasets                     # the default benchmark
    python tools/make_synthetic.py --root /tmp/d --tiny                # SyntheticReIDTiny
    python tools/make_synthetic.py --contact-sheet /tmp/sheet.png --no-write
    python tools/make_synthetic.py --root /tmp/d --train-ids 100 --test-ids 100 --force

The training code generates the default set by itself on first use; this command is for
writing it ahead of time, other sizes or difficulty settings, and for looking at samples.
"""
import argparse
import dataclasses
import logging
import os
import sys
import time

# run from a checkout
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reid_engine.data.datasets import (  # noqa: E402
    DEFAULT_SPEC,
    TINY_SPEC,
    ensure_synthetic_reid,
    resolve_data_root,
    write_contact_sheet,
)

logger = logging.getLogger("make_synthetic")

# command-line option -> SyntheticSpec field
SPEC_OPTIONS = {
    "train_ids": "num_train_ids", "test_ids": "num_test_ids", "cameras": "num_cameras",
    "distractors": "num_distractors", "palette_size": "palette_size",
    "occlusion_prob": "occlusion_prob", "noise": "noise", "cast_strength": "cast_strength",
    "blur": "blur", "seed": "seed",
}


def build_parser() -> argparse.ArgumentParser:
    """The command-line options (size and difficulty options default to the spec's values)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="", help="data root (default: $REID_DATASETS or "
                                                   "./datasets)")
    parser.add_argument("--tiny", action="store_true", help="start from the SyntheticReIDTiny "
                                                            "settings and folder")
    parser.add_argument("--folder", default="", help="folder under the root (default: "
                                                     "SyntheticReID or SyntheticReIDTiny)")
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    parser.add_argument("--no-write", action="store_true", help="only write the contact sheet")
    parser.add_argument("--contact-sheet", default="", help="write a PNG grid of samples here "
                                                            "(rows = identities, cols = cameras)")
    parser.add_argument("--sheet-ids", type=int, default=12, help="rows of the contact sheet")
    for opt, field in SPEC_OPTIONS.items():
        kind = type(getattr(DEFAULT_SPEC, field))
        parser.add_argument("--" + opt.replace("_", "-"), dest=opt, type=kind, default=None,
                            help=f"SyntheticSpec.{field}")
    return parser


def main(argv=None) -> int:
    """Run the command; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = TINY_SPEC if args.tiny else DEFAULT_SPEC
    overrides = {field: getattr(args, opt) for opt, field in SPEC_OPTIONS.items()
                 if getattr(args, opt) is not None}
    spec = dataclasses.replace(spec, **overrides)
    spec.validate()
    if not args.no_write:
        folder = args.folder or ("SyntheticReIDTiny" if args.tiny else "SyntheticReID")
        start = time.perf_counter()
        path = ensure_synthetic_reid(resolve_data_root(args.root), folder, spec, force=args.force)
        print(f"SyntheticReID ready at {path} ({time.perf_counter() - start:.1f} s)")
    if args.contact_sheet:
        write_contact_sheet(args.contact_sheet, spec, num_ids=args.sheet_ids)
        print(f"contact sheet written to {args.contact_sheet}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
