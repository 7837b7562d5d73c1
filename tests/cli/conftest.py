"""Fixtures of the command tests: the tiny checkpoint (shared with tests/inference), and logging hygiene."""
import contextlib
import logging

import pytest

from tests.inference.conftest import tiny_checkpoint, tiny_config_file, tiny_predictor  # noqa: F401


@contextlib.contextmanager
def _package_logger_restored():
    """Commands set up console logging on the package logger, bound to the captured stdout of the
    moment; put it back afterwards so that later tests log (and caplog sees records) as before."""
    logger = logging.getLogger("reid_engine")
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.propagate, logger.level = propagate, level


@pytest.fixture(autouse=True, scope="module")
def _restore_logger_after_module():
    """Covers module-scoped fixtures that run a command."""
    with _package_logger_restored():
        yield


@pytest.fixture(autouse=True)
def _restore_logger_after_test():
    with _package_logger_restored():
        yield
