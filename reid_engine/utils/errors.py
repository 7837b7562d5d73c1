"""The errors a user can fix, and the contract of their messages.

Every user-fixable error derives from :class:`ReidUserError`. Its message is ONE line
that names what is wrong, the config key, flag or path concerned, and the fix, in the
form ``<what> (<key>): <fix>`` (or an equivalent sentence holding all three). The
command line (``reid_engine.cli``) prints it as ``<prog>: error: <message>`` without a
traceback and exits with the error's ``exit_code``:

- 2 for usage errors: a bad flag, an unknown config key or a wrong config value;
- 1 for run failures: missing data, a corrupt image, a bad checkpoint, a NaN loss, a
  missing optional package.

Anything else that escapes a command is a bug and keeps its traceback.
"""
import importlib
import re
from typing import Optional, Tuple

__all__ = [
    "first_line",
    "ReidUserError",
    "ConfigError",
    "UsageError",
    "MissingPackageError",
    "DeviceUnavailableError",
    "InvalidDeviceError",
    "require_module",
    "user_error_of_traceback",
]

USAGE_EXIT_CODE = 2
RUN_FAILURE_EXIT_CODE = 1


# How torch re-raises an exception of a DataLoader worker (torch._utils.ExceptionWrapper):
# the same class, built from "Caught X in <where>.\nOriginal Traceback ...\n<module.X>: <message>".
_WORKER_WRAPPED = re.compile(r"^Caught \w+ (?P<where>in [^\n]*?)\.\nOriginal Traceback .*\n[\w.]+: (?P<message>[^\n]*)\n?$",
                             re.S)


class ReidUserError(Exception):
    """Base of every user-fixable error (bad config, missing data, bad checkpoint...).

    Raised in a DataLoader worker, it reaches the main process as the same class with its
    own one-line message (plus where it happened), not torch's multi-line wrapper text.

    Attributes:
        exit_code: the process exit status the command line ends with (1: a run failure).
    """

    exit_code = RUN_FAILURE_EXIT_CODE

    def __init__(self, *args) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            wrapped = _WORKER_WRAPPED.match(args[0])
            if wrapped:
                args = (f"{wrapped.group('message')} ({wrapped.group('where')})",)
        super().__init__(*args)


class ConfigError(ReidUserError, KeyError, ValueError):
    """A config problem the user can fix: an unknown key, a wrong type, a bad file (re-exported by
    ``reid_engine.config``; defined here so that the runtime and reliability layers raise it too)."""

    exit_code = 2  # a usage error (see ReidUserError)

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UsageError(ReidUserError, ValueError):
    """A bad argument or option value: the request itself cannot be carried out."""

    exit_code = USAGE_EXIT_CODE


class MissingPackageError(ReidUserError, ImportError):
    """An optional package a feature needs is not installed; the message names the pip command."""


class DeviceUnavailableError(ReidUserError, RuntimeError):
    """MODEL.DEVICE names a device this machine does not have."""


class InvalidDeviceError(ReidUserError, ValueError):
    """MODEL.DEVICE is not a device name torch understands."""

    exit_code = USAGE_EXIT_CODE


# The last line of a formatted traceback: "<module.Class>: <message>".
_EXCEPTION_LINE = re.compile(r"^(?P<cls>[A-Za-z_][\w.]*): (?P<message>.*)$")


def user_error_of_traceback(text: str) -> Optional[Tuple[type, str]]:
    """The user error that a formatted traceback (a spawned worker's, as ``launch`` re-raises it) ends with.

    Returns:
        (its :class:`ReidUserError` class, its one-line message), or None when the traceback ends
        with any other exception (a bug: its traceback is what to show).
    """
    lines = text.strip().splitlines()
    match = _EXCEPTION_LINE.match(lines[-1]) if lines else None
    if match is None:
        return None
    module_name, _, name = match.group("cls").rpartition(".")
    try:
        error_class = getattr(importlib.import_module(module_name or "builtins"), name, None)
    except (ImportError, ValueError):
        return None
    if isinstance(error_class, type) and issubclass(error_class, ReidUserError):
        return error_class, match.group("message")
    return None


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its class name when the message is empty): what a
    one-line error quotes of a third-party library's multi-line exception."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def require_module(name: str, purpose: str, package: Optional[str] = None):
    """Import an optional dependency, or fail with a one-line install hint.

    Args:
        name: the module to import (e.g. "matplotlib").
        purpose: what needs it (first words of the message).
        package: the pip package name when it differs from `name`.
    Returns:
        the imported module.
    Raises:
        MissingPackageError: the module is not installed.
    """
    try:
        return importlib.import_module(name)
    except ImportError:
        raise MissingPackageError(
            f"{purpose} needs {name}, which is not installed: pip install {package or name}") from None
