"""The one error boundary of every command.

A `ReidUserError` (see `reid_engine.utils.errors`) becomes one line on stderr,
``<prog>: error: <message>``, and the exit status is the error's ``exit_code`` (2 for
usage errors, 1 for run failures). A user error raised inside a spawned worker process
ends the same way. With ``--debug`` or ``REID_DEBUG=1`` the traceback is printed too.
Any other exception is a bug: its traceback is printed, then a one-line summary, and
the exit status is 1.
"""
import argparse
import os
import sys
import traceback
from typing import Any, Callable, List, Optional

import torch.multiprocessing as mp

from ..utils.errors import RUN_FAILURE_EXIT_CODE, ReidUserError, user_error_of_traceback

__all__ = ["DEBUG_ENV", "debug_requested", "run_command"]

DEBUG_ENV = "REID_DEBUG"


def debug_requested(args: Any = None) -> bool:
    """Whether tracebacks are wanted: the `--debug` flag or ``REID_DEBUG`` set to a non-zero value."""
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def run_command(prog: str, parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], Any],
                argv: Optional[List[str]] = None) -> int:
    """Parse the command line, run the command's body, and turn its errors into exit codes.

    Args:
        prog: the command's name, first word of the error line.
        parser: the command's parser (argparse prints its own usage errors, exit 2).
        body: the command; called with the parsed arguments; may return an exit status.
        argv: the arguments (default: sys.argv[1:]).
    Returns:
        the process exit status: 0 on success, else see the module docstring.
    """
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed by argparse
        return e.code if isinstance(e.code, int) else RUN_FAILURE_EXIT_CODE
    debug = debug_requested(args)
    try:
        status = body(args)
    except ReidUserError as e:
        if debug:
            traceback.print_exc()
        _print_error(prog, str(e))
        return e.exit_code
    except mp.ProcessRaisedException as e:
        return _worker_failed(prog, str(e), debug)
    except Exception as e:  # a bug rather than bad input: keep the traceback
        traceback.print_exc()
        _print_error(prog, f"{type(e).__name__}: {e}")
        return RUN_FAILURE_EXIT_CODE
    return status if isinstance(status, int) else 0


def _worker_failed(prog: str, worker_traceback: str, debug: bool) -> int:
    """End a job whose worker raised: one line for a user error, the worker's traceback for a bug."""
    text = worker_traceback.strip()
    user_error = user_error_of_traceback(text)
    if user_error is not None:
        error_class, message = user_error
        if debug:
            print(text, file=sys.stderr)
        _print_error(prog, message)
        return error_class.exit_code
    print(text, file=sys.stderr)
    _print_error(prog, (text.splitlines()[-1] if text else "") or "a worker process failed")
    return RUN_FAILURE_EXIT_CODE


def _print_error(prog: str, message: str) -> None:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
