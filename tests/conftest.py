"""Shared fixtures: a session-wide data root with the tiny synthetic benchmark."""
import contextlib
import logging
import os
import subprocess
import sys

import pytest
import torch

# Tiny models on a 2-core machine: one intra-op thread avoids thread contention
# (test runtimes drop several-fold) and keeps numerics the same run to run.
torch.set_num_threads(1)
# The same for the commands the tests start: a fixed count (the user's override) keeps the thread
# policy from following the load of the other tests, so a run and its resume compute alike; and
# the cores count as measured quiet, so no command spends 0.1 s measuring them (runtime.thread_policy).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("REID_ENGINE_BUSY_CPUS", "0")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """A data root holding SyntheticReIDTiny, generated once per test session."""
    root = tmp_path_factory.mktemp("datasets")
    from reid_engine.data.datasets import get_dataset

    get_dataset("SyntheticReIDTiny", str(root))
    return str(root)


def run_cli(args, cwd=None, timeout=240, env=None):
    """Run `tools/train_net.py` in a fresh interpreter; returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONPATH"] = REPO_ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    cmd = [sys.executable, os.path.join(REPO_ROOT, "tools", "train_net.py")] + list(args)
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def _loggers_restored(names=("reid_engine", "fvcore")):
    """Put the package loggers back as they were. Run set-up (setup_logger, commands run
    in-process, DefaultTrainer) stops their propagation and binds console handlers to the
    captured stdout of the moment; without this, later tests' caplog would see nothing."""
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate, logging.getLogger(n).level)
             for n in names}
    try:
        yield
    finally:
        for name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.propagate, logger.level = propagate, level


@pytest.fixture(autouse=True, scope="module")
def _restore_loggers_after_module():
    """Covers module-scoped fixtures that set up logging."""
    with _loggers_restored():
        yield


@pytest.fixture(autouse=True)
def _restore_loggers_after_test():
    with _loggers_restored():
        yield


@contextlib.contextmanager
def records_of(caplog, name):
    """Route the records of logger `name` (INFO and up) to `caplog`, each once, even if an app
    logger stopped its propagation; the logger is put back afterwards."""
    log = logging.getLogger(name)
    saved = log.level, log.propagate
    log.addHandler(caplog.handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # each record once, whatever the root logger does
    try:
        yield caplog
    finally:
        log.removeHandler(caplog.handler)
        log.level, log.propagate = saved


# The fast tier (`pytest -m "not slow"`) stays fast only if slow tests are marked: an unmarked
# test over this many seconds (setup + call + teardown) is named at the end of the run.
UNMARKED_SLOW_SECONDS = 5.0
_unmarked_slow = {}


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (each worker collects; ``--dist loadfile`` hands whole files to whichever
    worker is free, in collection order): the files with the most slow tests first, so that a long
    file does not start last while the other worker has nothing left. A plain run keeps pytest's order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_per_file = {}
    for item in items:
        slow_per_file[item.path] = slow_per_file.get(item.path, 0) + ("slow" in item.keywords)
    items.sort(key=lambda item: -slow_per_file[item.path])  # stable: files and tests keep their order otherwise


def pytest_runtest_logreport(report):
    """Add up each unmarked test's phases, to name the slow ones in the terminal summary."""
    if "slow" not in report.keywords:
        _unmarked_slow[report.nodeid] = _unmarked_slow.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Name the unmarked tests that took longer than UNMARKED_SLOW_SECONDS (a hint, never a failure)."""
    slow = sorted(((t, n) for n, t in _unmarked_slow.items() if t > UNMARKED_SLOW_SECONDS), reverse=True)
    if slow:
        terminalreporter.write_sep("-", f"unmarked tests over {UNMARKED_SLOW_SECONDS:g} s: mark them @pytest.mark.slow")
        for seconds, nodeid in slow:
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
