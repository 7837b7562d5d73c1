"""Logging setup (colored console on the main process, a log file per process) and
rate-limited logging helpers."""

import atexit
import contextlib
import logging
import os
import sys
import time
from collections import Counter
from typing import Dict, Optional, Tuple, Union

from termcolor import colored

from .file_io import FileWriteError, RecordFile, write_failure

__all__ = ["HIGHLIGHT", "setup_logger", "setup_run_logging", "close_log_file", "check_log_writes", "log_first_n", "log_every_n",
           "log_every_n_seconds"]

_PLAIN_FORMAT = "[%(asctime)s] %(name)s %(levelname)s: %(message)s"
_DATE_FORMAT = "%m/%d %H:%M:%S"
# Attribute marking the handlers setup_logger installed, so a second call replaces
# them instead of adding duplicates.
_HANDLER_TAG = "_reid_engine_handler"
# Record attribute asking the color console to syntax-highlight the lines after a message's
# first line: ``log.info("config:\n" + text, extra={HIGHLIGHT: "yaml"})``. Files stay plain.
HIGHLIGHT = "reid_highlight"


class _ColorfulFormatter(logging.Formatter):
    """Console formatter: abbreviates the package name and highlights warnings/errors."""

    def __init__(self, *args, root_name: str, abbrev_name: str, **kwargs):
        self._root_name = root_name + "."
        self._abbrev_name = abbrev_name + "." if abbrev_name else ""
        super().__init__(*args, **kwargs)

    def formatMessage(self, record: logging.LogRecord) -> str:
        # A copy: the record is shared with the file handler, which shows the full name.
        record = logging.makeLogRecord(record.__dict__)
        if record.name.startswith(self._root_name):
            record.name = self._abbrev_name + record.name[len(self._root_name):]
        language = getattr(record, HIGHLIGHT, None)
        if language and "\n" in record.message:
            head, code = record.message.split("\n", 1)
            record.message = head + "\n" + _highlight(code, language)
        log = super().formatMessage(record)
        if record.levelno == logging.WARNING:
            prefix = colored("WARNING", "red", attrs=["blink"], force_color=True)
        elif record.levelno >= logging.ERROR:
            prefix = colored("ERROR", "red", attrs=["blink", "underline"], force_color=True)
        else:
            return log
        return prefix + " " + log


def _highlight(code: str, language: str) -> str:
    """Syntax-color ``code`` ("yaml" or "python") for a terminal; the code itself on any failure."""
    try:
        from pygments import highlight
        from pygments.formatters import Terminal256Formatter
        from pygments.lexers import Python3Lexer, YamlLexer

        lexer = Python3Lexer() if language == "python" else YamlLexer()
        return highlight(code, lexer, Terminal256Formatter(style="monokai")).rstrip("\n")
    except Exception:  # color is a nicety; never fail a log record over it
        return code


def _console_supports_color() -> bool:
    """Color a terminal only; NO_COLOR / FORCE_COLOR (https://no-color.org) override."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(sys.stdout, "isatty") and sys.stdout.isatty()


class _LogFile:
    """The stream of a log file's handler: each line appended whole (:class:`RecordFile`).

    A line that cannot be written (disk full, file size limit) is not reported by the
    handler (``logging`` would print a traceback to stderr for each line and go on, the
    log silently losing its end); the first failure is kept, later lines are dropped, and
    :func:`check_log_writes` turns it into one error line that stops the run.
    """

    def __init__(self, path: str):
        self.name = path
        self._file = RecordFile(path, "the log")
        self._lost_since: Optional[float] = None  # time of the first line not written

    def write(self, text: str) -> None:
        """Append one formatted record (keeping the first failure)."""
        try:
            self._file.write(text)
        except OSError:
            if self._lost_since is None:
                self._lost_since = time.time()

    def flush(self) -> None:
        """Nothing to flush: each line is written whole when logged."""

    def failure(self) -> Optional[FileWriteError]:
        """The one-line error for the first line not written, None when all were."""
        if self._lost_since is None:
            return None
        since = time.strftime(_DATE_FORMAT, time.localtime(self._lost_since))
        return self._file.failure(then=f"then continue with --resume (its lines from {since} on are not in it)")

    def close(self) -> None:
        """Close the file; a failure to close is the failure already reported, if any."""
        with contextlib.suppress(OSError):
            self._file.close()


def _stream_path(stream) -> str:
    """The file a stream writes to (``/proc/self/fd`` finds a redirected stdout's), else its name."""
    name = getattr(stream, "name", None)
    if isinstance(name, str) and not name.startswith("<"):
        return name
    with contextlib.suppress(Exception):
        target = os.readlink(f"/proc/self/fd/{stream.fileno()}")
        if os.path.isabs(target):
            return target
    return name if isinstance(name, str) else "the console"


class _Console:
    """The console handler's stream (stdout at set-up). When the console is a file on a
    full disk (or a closed pipe), one warning line goes to stderr and later console lines
    are dropped: logging would print a traceback for each line. The run goes on: log.txt
    keeps every line."""

    def __init__(self, stream):
        self._stream = stream
        self.failed = False

    def write(self, text: str) -> None:
        """Write to the console unless it failed before."""
        self._guarded(self._stream.write, text)

    def flush(self) -> None:
        """Flush the console unless it failed before."""
        self._guarded(self._stream.flush)

    def _guarded(self, method, *args) -> None:
        if self.failed:
            return
        try:
            method(*args)
        except OSError as e:
            self.failed = True
            error = write_failure(_stream_path(self._stream), e, "the console output to",
                                  then="the run goes on, its lines only in the log file")
            with contextlib.suppress(Exception):
                sys.stderr.write(f"warning: {error}\n")
                sys.stderr.flush()


# One stream per log file, shared by every logger writing to it (the package's and fvcore's).
_LOG_FILES: Dict[str, _LogFile] = {}
# The loggers setup_logger configured: check_log_writes looks at their file handlers.
_CONFIGURED: Dict[str, None] = {}


def _log_file(filename: str) -> _LogFile:
    """The shared stream of a log file, opened (for appending) on first use, and again
    after a failure (a new run in this process tries the file afresh)."""
    if filename not in _LOG_FILES or _LOG_FILES[filename].failure() is not None:
        _LOG_FILES[filename] = _LogFile(filename)
        atexit.register(_LOG_FILES[filename].close)
    return _LOG_FILES[filename]


def check_log_writes() -> None:
    """Stop on a log line that could not be written.

    Raises:
        FileWriteError: one line naming the first log file (of the loggers
            :func:`setup_logger` configured) with a lost line, the reason, the free space
            there and which lines are missing.
    """
    for name in _CONFIGURED:
        for handler in logging.getLogger(name).handlers:
            stream = getattr(handler, "stream", None)
            error = stream.failure() if isinstance(stream, _LogFile) else None
            if error is not None:
                raise error


def _log_file_path(output: str, distributed_rank: int) -> str:
    """``output/log.txt`` (or ``output`` itself for a .txt/.log path), ``.rankN`` for N > 0."""
    filename = output if output.endswith((".txt", ".log")) else os.path.join(output, "log.txt")
    if distributed_rank > 0:
        filename = f"{filename}.rank{distributed_rank}"
    return filename


def _replace_handler(logger: logging.Logger, kind: str, handler: Optional[logging.Handler]) -> None:
    """Remove the handler of ``kind`` a previous setup_logger call added; add ``handler``."""
    for old in list(logger.handlers):
        if getattr(old, _HANDLER_TAG, None) == kind:
            logger.removeHandler(old)
    if handler is not None:
        setattr(handler, _HANDLER_TAG, kind)
        logger.addHandler(handler)


def setup_logger(
    output: Optional[str] = None,
    distributed_rank: int = 0,
    *,
    color: bool = True,
    name: str = "reid_engine",
    abbrev_name: Optional[str] = None,
    enable_propagation: bool = False,
) -> logging.Logger:
    """Configure logger ``name`` (by default the package root, so every
    ``reid_engine.*`` module logger is covered).

    Rank 0 logs to stdout (colored when ``color`` and stdout is a terminal, or
    FORCE_COLOR is set); every rank logs to a file.
    Calling it again replaces the handlers it installed before (never duplicates them).

    Args:
        output: a directory (logs go to ``output/log.txt``) or a ``.txt``/``.log`` file
            path; None for no file. Ranks N > 0 write ``<file>.rankN``.
        distributed_rank: this process's global rank.
        color: color the console output (terminals only; warnings/errors highlighted).
        name: the logger to configure.
        abbrev_name: shown instead of ``name`` in console records of sub-loggers
            (defaults to ``name``).
        enable_propagation: also pass records to the parent (root) logger.

    Returns:
        The configured logger.
    """
    logger = logging.getLogger(name)
    _CONFIGURED[name] = None
    logger.setLevel(logging.DEBUG)
    logger.propagate = enable_propagation
    abbrev_name = name if abbrev_name is None else abbrev_name
    plain_formatter = logging.Formatter(_PLAIN_FORMAT, datefmt=_DATE_FORMAT)

    console = None
    if distributed_rank == 0:
        console = logging.StreamHandler(stream=_Console(sys.stdout))
        console.setLevel(logging.DEBUG)
        if color and _console_supports_color():
            console.setFormatter(
                _ColorfulFormatter(
                    colored("[%(asctime)s %(name)s]: ", "green", force_color=True) + "%(message)s",
                    datefmt=_DATE_FORMAT,
                    root_name=name,
                    abbrev_name=abbrev_name,
                )
            )
        else:
            console.setFormatter(plain_formatter)
    _replace_handler(logger, "console", console)

    file_handler = None
    if output is not None:
        filename = _log_file_path(output, distributed_rank)
        os.makedirs(os.path.dirname(os.path.abspath(filename)), exist_ok=True)
        file_handler = logging.StreamHandler(_log_file(os.path.abspath(filename)))
        file_handler.setLevel(logging.DEBUG)
        file_handler.setFormatter(plain_formatter)
    _replace_handler(logger, "file", file_handler)
    return logger


def setup_run_logging(output: Optional[str], distributed_rank: int = 0) -> logging.Logger:
    """Send a run's log (the package's logger, and fvcore's, which reports checkpoint loading)
    to the console and to `output`'s log file (see :func:`setup_logger`).

    Returns:
        the package's logger.
    """
    setup_logger(output, distributed_rank=distributed_rank, name="fvcore")
    return setup_logger(output, distributed_rank=distributed_rank)


def close_log_file(output: str, distributed_rank: int = 0) -> None:
    """Close the log file of ``setup_logger(output, distributed_rank)`` when no configured logger
    writes to it any more (after :func:`setup_logger` pointed them elsewhere): a process that runs
    several runs one after the other (reid-tune's trials) then keeps no file open per run.
    """
    filename = os.path.abspath(_log_file_path(output, distributed_rank))
    stream = _LOG_FILES.get(filename)
    if stream is None:
        return
    for name in _CONFIGURED:
        if any(getattr(h, "stream", None) is stream for h in logging.getLogger(name).handlers):
            return
    _LOG_FILES.pop(filename).close()


# ---- rate-limited logging ------------------------------------------------------------
_FIRST_N_COUNTER: Counter = Counter()
_EVERY_N_COUNTER: Counter = Counter()
_LAST_LOGGED_TIME: dict = {}


def _find_caller() -> Tuple[str, Tuple[str, int, str]]:
    """Return (module name, (file, line, function)) of the first frame outside this file."""
    frame = sys._getframe(1)
    this_file = os.path.normcase(os.path.abspath(__file__))
    while frame is not None:
        code = frame.f_code
        if os.path.normcase(os.path.abspath(code.co_filename)) != this_file:
            module = frame.f_globals.get("__name__", "reid_engine")
            if module == "__main__":
                module = "reid_engine"
            return module, (code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return "reid_engine", ("<unknown>", 0, "<unknown>")


def log_first_n(lvl: int, msg: str, n: int = 1, *, name: Optional[str] = None,
                key: Union[str, Tuple[str, ...]] = "caller") -> None:
    """Log ``msg`` only the first ``n`` times for a given key.

    Args:
        lvl: logging level.
        msg: the message.
        n: how many times to log it.
        name: logger name; defaults to the caller's module.
        key: "caller" (count per call site), "message" (per message text), or both
            as a tuple.
    """
    keys = (key,) if isinstance(key, str) else tuple(key)
    if not keys or not set(keys) <= {"caller", "message"}:
        raise ValueError(f"log_first_n key must be 'caller', 'message' or both, got {key!r}")
    module, caller = _find_caller()
    hash_key: tuple = ()
    if "caller" in keys:
        hash_key += caller
    if "message" in keys:
        hash_key += (msg,)
    _FIRST_N_COUNTER[hash_key] += 1
    if _FIRST_N_COUNTER[hash_key] <= n:
        logging.getLogger(name or module).log(lvl, msg)


def log_every_n(lvl: int, msg: str, n: int = 1, *, name: Optional[str] = None) -> None:
    """Log ``msg`` on the 1st, (n+1)th, (2n+1)th ... call from the same call site."""
    module, caller = _find_caller()
    _EVERY_N_COUNTER[caller] += 1
    if n <= 1 or _EVERY_N_COUNTER[caller] % n == 1:
        logging.getLogger(name or module).log(lvl, msg)


def log_every_n_seconds(lvl: int, msg: str, n: float = 1, *, name: Optional[str] = None) -> None:
    """Log ``msg`` from a call site at most once every ``n`` seconds."""
    module, caller = _find_caller()
    now = time.time()
    last = _LAST_LOGGED_TIME.get(caller)
    if last is None or now - last >= n:
        logging.getLogger(name or module).log(lvl, msg)
        _LAST_LOGGED_TIME[caller] = now
