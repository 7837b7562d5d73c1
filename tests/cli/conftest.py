"""Fixtures of the command tests: the tiny checkpoint (shared with tests/inference).

Logging hygiene (the package logger restored after each test) is in tests/conftest.py."""
from tests.inference.conftest import tiny_checkpoint, tiny_config_file, tiny_predictor  # noqa: F401
