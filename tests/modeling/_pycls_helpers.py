"""Shared helpers of the RegNet and EfficientNet tests: configs, builds, and checks that an
ImageNet file in a release layout loads completely."""
import logging
import re

import pytest
import torch
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.modeling import BACKBONE_REGISTRY
from reid_engine.utils import checkpoint as ckpt_module


def backbone_cfg(name, depth, **opts):
    """A CPU config for backbone `name` at `depth`, other MODEL.BACKBONE keys from `opts`."""
    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.NAME = name
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.BACKBONE.PRETRAIN = False
    for key, value in opts.items():
        setattr(cfg.MODEL.BACKBONE, key, value)
    return cfg


def build(name, depth, seed=0, **opts):
    """Build backbone `name` at `depth` with a fixed seed."""
    torch.manual_seed(seed)
    return BACKBONE_REGISTRY.build(name, backbone_cfg(name, depth, **opts))


@pytest.fixture
def load_logs(caplog, monkeypatch):
    """caplog at INFO for the shared checkpoint loader, even after setup_logger stopped propagation."""
    monkeypatch.setattr(logging.getLogger("reid_engine"), "propagate", True)
    caplog.set_level(logging.INFO, logger=ckpt_module.__name__)
    return caplog


def with_random_statistics(model):
    """Give every BatchNorm non-trivial running statistics (so that a skipped buffer shows)."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2)
    return model


def rename(state, rules):
    """Apply (pattern, replacement) regex rules in order to every key of `state`."""
    renamed = {}
    for key, value in state.items():
        for pattern, replacement in rules:
            key = re.sub(pattern, replacement, key)
        renamed[key] = value.clone()
    return renamed


def assert_loads_completely(name, depth, source, payload, path, logs, **opts):
    """Save `payload` at `path`, build `name`/`depth` from it with PRETRAIN and check that
    every tensor equals `source`'s and that the log reports nothing missing or unused."""
    torch.save(payload, path)
    loaded = build(name, depth, seed=1, PRETRAIN=True, PRETRAIN_PATH=str(path), **opts)
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    count = len(source.state_dict())
    assert f"Loaded {count} of {count} model tensors from {path}." in logs.text
    assert "Not in the checkpoint" not in logs.text
    assert "not used by the model" not in logs.text  # the classifier is dropped silently
    assert all(record.levelno < logging.WARNING for record in logs.records)
