"""Shared helpers of the backbone-family tests (test_resnest.py, test_resnext.py): configs,
builds, synthetic ImageNet release files and the loader's log."""
import logging

import torch
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.modeling import BACKBONE_REGISTRY


def family_cfg(name, depth, **opts):
    """A CPU config for backbone `name` at `depth`, no pretrained weights, MODEL.BACKBONE.<key> = opts."""
    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.NAME = name
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.BACKBONE.PRETRAIN = False
    for key, value in opts.items():
        setattr(cfg.MODEL.BACKBONE, key, value)
    return cfg


def build(name, depth, seed=0, **opts):
    """The backbone of family_cfg(name, depth, **opts), built after seeding torch."""
    torch.manual_seed(seed)
    return BACKBONE_REGISTRY.build(name, family_cfg(name, depth, **opts))


def with_running_stats(model):
    """Give every BatchNorm non-trivial running statistics (so that a skipped buffer shows); returns model."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2)
    return model


def save_release_file(model, path, rename=None):
    """Save `model`'s state dict as an ImageNet release would: keys mapped by `rename`
    (state -> state, identity by default) and a 1000-class `fc` classifier added."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if rename is not None:
        state = rename(state)
    state["fc.weight"] = torch.randn(1000, model.out_channels)
    state["fc.bias"] = torch.randn(1000)
    torch.save(state, path)
    return str(path)


def assert_fully_loaded(source, loaded, path, logs):
    """Every tensor of `source` arrived in `loaded`, and the log reports nothing missing or unused."""
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    count = len(source.state_dict())
    assert f"Loaded {count} of {count} model tensors from {path}." in logs.text
    assert "Not in the checkpoint" not in logs.text       # nothing missing
    assert "not used by the model" not in logs.text       # fc.* is dropped silently
    assert all(record.levelno < logging.WARNING for record in logs.records)
