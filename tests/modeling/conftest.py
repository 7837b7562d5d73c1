"""Fixtures shared by the modeling tests."""
import logging

import pytest
import torch

from reid_engine.utils import checkpoint as ckpt_module


@pytest.fixture
def load_logs(caplog, monkeypatch):
    """caplog at INFO for the shared checkpoint loader, even after setup_logger stopped propagation."""
    monkeypatch.setattr(logging.getLogger("reid_engine"), "propagate", True)
    caplog.set_level(logging.INFO, logger=ckpt_module.__name__)
    return caplog


@pytest.fixture(scope="module")
def two_torch_threads():
    """At most 2 torch threads for a module (use with pytest.mark.usefixtures); restored after it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(min(2, previous))
    yield
    torch.set_num_threads(previous)
