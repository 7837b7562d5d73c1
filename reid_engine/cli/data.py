"""Check a dataset under the data root without training (`reid-data check NAME`).

    reid-data check Market1501                        # DATASETS.ROOT, else $REID_DATASETS, else ./datasets
    reid-data check VeRiWild --data-root /data/reid
    reid-data check viper DATASETS.SPLIT_ID 3
    reid-data check MSMT17 --no-decode                # names and lists only, no image opened

`check` parses the dataset as training does (same data root and DATASETS.SPLIT_ID) and
prints a table of ids, images and cameras per split, with the junk images dropped and
the distractors kept where the dataset has them. Then it lists every file (or list-file
line) that does not fit the dataset's layout, with the rule it breaks, and every image
that does not decode (each image is opened and decoded unless --no-decode); training
would stop at the first of them. Files left out on purpose (hidden and system files such
as ._*, .DS_Store, __MACOSX/, Thumbs.db, and files that are not images) are counted and
the first few named. The exit status is 0 when nothing was found, 1 when a file breaks
the layout, an image does not decode or the dataset cannot be read, 2 for a wrong name
or option.
"""
import argparse
import sys
from typing import List, Optional

from tabulate import tabulate

from ..data.datasets import resolve_data_root
from ..data.datasets.check import DatasetCheck, check_dataset, statistics_headers, statistics_rows
from ..utils.errors import RUN_FAILURE_EXIT_CODE
from .base import build_config, command_parser
from .boundary import run_command

__all__ = ["PROG", "ACTIONS", "build_parser", "format_check", "run", "main"]

PROG = "reid-data"
ACTIONS = ("check",)


def build_parser() -> argparse.ArgumentParser:
    """The shared base plus the action, the dataset name, --data-root and the config flags.

    Options may come anywhere, also after the name (``check NAME --data-root DIR KEY VALUE``):
    the parser reads intermixed arguments, so the trailing config overrides are a plain
    list here rather than the other commands' "everything that follows".
    """
    parser = command_parser(PROG, __doc__, config=False)
    parser.add_argument("action", choices=ACTIONS, help="check: parse the dataset and report its statistics and "
                        "every file that breaks its layout")
    parser.add_argument("name", help="registered dataset name, as in DATASETS.NAMES (e.g. Market1501)")
    parser.add_argument("--data-root", default="", help="the data root (default: DATASETS.ROOT, else "
                        "$REID_DATASETS, else ./datasets)")
    parser.add_argument("--no-decode", action="store_true", help="do not open and decode every image (faster: "
                        "names, folders and list files only)")
    parser.add_argument("--config-file", default="", metavar="FILE", help="config file (DATASETS.ROOT, "
                        "DATASETS.SPLIT_ID)")
    parser.add_argument("opts", nargs="*", metavar="KEY VALUE",
                        help="config overrides as KEY VALUE pairs, e.g. DATASETS.SPLIT_ID 3")
    parser.parse_args = parser.parse_intermixed_args  # see the docstring
    return parser


SKIPPED_NAMED = 5  # how many of the files left out the report names


def format_check(result: DatasetCheck) -> str:
    """The report of :func:`check_dataset`: the statistics table, the files left out, then the problems, one per line."""
    lines = [f"{result.name} under {result.root}"]
    if result.dataset is not None:
        lines.append(f"read from {result.dataset.source}")
        lines.append(tabulate(statistics_rows(result.dataset), headers=statistics_headers(result.dataset), tablefmt="pipe",
                              numalign="right", stralign="right"))
    if result.skipped:
        named = ", ".join(item.path for item in result.skipped[:SKIPPED_NAMED])
        more = f" and {len(result.skipped) - SKIPPED_NAMED} more" if len(result.skipped) > SKIPPED_NAMED else ""
        lines.append(f"{len(result.skipped)} file(s) left out (hidden, system or not images): {named}{more}")
    if result.decoded:
        lines.append(f"opened and decoded {result.decoded} image(s)")
    if result.problems:
        lines.append(f"{len(result.problems)} file(s) do not fit the layout:")
        lines += [f"  {problem.path}: expected {problem.rule}"
                  for problem in sorted(result.problems, key=lambda problem: problem.path)]
    elif result.error is None:
        lines.append("every file fits the layout")
    return "\n".join(lines)


def _print_progress(done: int, total: int, seconds: float) -> None:
    """A progress line with ETA on stderr while the images are decoded."""
    eta = seconds / done * (total - done)
    print(f"{PROG}: decoded {done}/{total} images ({100 * done // total}%), {seconds:.0f} s, ETA {eta:.0f} s",
          file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Check the dataset, print the report, and return the exit status."""
    cfg = build_config(args)
    root = resolve_data_root(args.data_root or cfg.DATASETS.ROOT)
    result = check_dataset(args.name, root, split_id=cfg.DATASETS.SPLIT_ID, decode=not args.no_decode,
                           progress=_print_progress)
    print(format_check(result))
    if result.error is not None:
        print(f"{PROG}: error: {result.error}", file=sys.stderr)
    return 0 if result.ok else RUN_FAILURE_EXIT_CODE


def main(argv: Optional[List[str]] = None) -> int:
    """Run `reid-data` with `argv` (default: sys.argv[1:]); returns the exit status."""
    return run_command(PROG, build_parser(), run, argv)
