"""RNG seeding and state capture, device resolution, and the environment table."""
import logging
import random

import numpy as np
import pytest
import torch

from reid_engine.utils.collect_env import collect_env_info
from reid_engine.utils.env import get_rng_states, resolve_device, seed_all_rng, set_rng_states


def _draw():
    return (random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(3).tolist())


def test_seed_all_rng_is_reproducible():
    assert seed_all_rng(123) == 123
    first = _draw()
    seed_all_rng(123)
    assert _draw() == first
    assert seed_all_rng(2**40 + 5) == 2**40 + 5  # larger than numpy's 32-bit range: still works


def test_seed_all_rng_random_seed_is_logged(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("reid_engine"), "propagate", True)
    caplog.set_level(logging.INFO, logger="reid_engine")
    seed = seed_all_rng(-1)
    assert isinstance(seed, int) and seed >= 0
    assert f"Using a generated random seed {seed}" in caplog.text


def test_rng_states_round_trip_through_weights_only_load(tmp_path):
    seed_all_rng(7)
    np.random.randn()  # leaves a cached gaussian in numpy's legacy state
    states = get_rng_states()
    expected = _draw()
    path = tmp_path / "rng.pth"
    torch.save(states, path)
    loaded = torch.load(path, weights_only=True)
    seed_all_rng(99)  # move every generator elsewhere
    set_rng_states(loaded)
    assert _draw() == expected


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("AUTO") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="MODEL.DEVICE"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        for name in ("cuda", "cuda:1"):
            with pytest.raises(RuntimeError, match="set MODEL.DEVICE cpu"):
                resolve_device(name)


def test_collect_env_info_lists_the_stack():
    text = collect_env_info()
    for item in ("sys.platform", "Python", "numpy", "PyTorch", "CUDA available", "Pillow", "fvcore",
                 "yacs", "tensorboardX", "tabulate", "reid_engine", "CPU count"):
        assert item in text, item
    assert torch.__version__ in text
