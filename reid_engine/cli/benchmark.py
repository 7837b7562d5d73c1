"""Run one of the benchmark scripts of a reid_engine checkout by name (`reid-benchmark`).

    reid-benchmark                                   # list the benchmarks
    reid-benchmark bench_model --device cuda --steps 20
    reid-benchmark bench_evaluation --cases small

The scripts live in `tools/benchmarks/` of a source checkout (they are not installed
with the package); they are searched in the current folder's checkout, then in the
checkout the package was installed from (`pip install -e .`). Everything after NAME is
passed to the script; its exit status is this command's.
"""
import argparse
import os
import subprocess
import sys
from typing import List, Optional

import reid_engine

from ..utils.errors import UsageError
from .base import command_parser
from .boundary import run_command

__all__ = ["PROG", "BenchmarkNotFoundError", "benchmark_folder", "list_benchmarks", "build_parser", "run", "main"]

PROG = "reid-benchmark"
BENCHMARK_DIR = os.path.join("tools", "benchmarks")


class BenchmarkNotFoundError(UsageError):
    """No checkout with tools/benchmarks/, or no benchmark of the given name."""


def _package_parent() -> str:
    """The folder holding the imported reid_engine package (a checkout's root for `pip install -e .`)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(reid_engine.__file__)))


def _candidate_folders() -> List[str]:
    return list(dict.fromkeys(os.path.abspath(os.path.join(root, BENCHMARK_DIR))
                              for root in (os.getcwd(), _package_parent())))


def benchmark_folder() -> str:
    """The checkout's `tools/benchmarks/` folder.

    Returns:
        its absolute path (the current folder's checkout first, then the package's).
    Raises:
        BenchmarkNotFoundError: neither exists (e.g. the package was installed from a wheel).
    """
    candidates = _candidate_folders()
    for folder in candidates:
        if os.path.isdir(folder):
            return folder
    raise BenchmarkNotFoundError(f"no benchmark folder found ({' or '.join(candidates)}): run reid-benchmark "
                                 "inside a reid_engine source checkout (the benchmarks are not installed)")


def list_benchmarks(folder: str) -> List[str]:
    """The benchmark names in `folder`: its `*.py` scripts without the extension, sorted."""
    return sorted(name[:-3] for name in os.listdir(folder) if name.endswith(".py") and not name.startswith("_"))


def build_parser() -> argparse.ArgumentParser:
    """The shared base (no config) plus NAME and the script's own arguments."""
    parser = command_parser(PROG, __doc__, config=False)
    parser.add_argument("name", nargs="?", default="", metavar="NAME", help="the benchmark to run (none: list them)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments of the benchmark")
    return parser


def run(args: argparse.Namespace) -> int:
    """List the benchmarks, or run the named one in a fresh interpreter.

    Returns:
        the script's exit status (0 when listing).
    """
    folder = benchmark_folder()
    names = list_benchmarks(folder)
    if not args.name:
        print("\n".join(names))
        return 0
    if args.name not in names:
        raise BenchmarkNotFoundError(f"unknown benchmark {args.name!r} (NAME): choose one of {', '.join(names)}")
    # The script (and the processes it starts) import the same reid_engine as this command.
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [_package_parent(), os.environ.get("PYTHONPATH")])))
    script = os.path.join(folder, args.name + ".py")
    return subprocess.run([sys.executable, script, *args.script_args], env=env).returncode


def main(argv: Optional[List[str]] = None) -> int:
    """Run `reid-benchmark` with `argv` (default: sys.argv[1:]); returns the exit status."""
    return run_command(PROG, build_parser(), run, argv)
