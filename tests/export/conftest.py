"""The tiny checkpoint fixtures, shared with tests/inference."""
from tests.inference.conftest import tiny_checkpoint, tiny_config_file, tiny_predictor  # noqa: F401
