"""Shared helpers of the backbone-family tests (test_resnest.py, test_resnext.py, the pycls
families, test_backbone_check_config.py): configs, builds, synthetic ImageNet release files,
the loader's log, and the check that a family's config check builds nothing."""
import logging

import pytest
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


def assert_check_config_refuses(monkeypatch, name, model_cls, refused, accepted):
    """`name`'s check_config, and the registry's, refuse one config and accept another, building nothing.

    Args:
        monkeypatch: pytest's fixture; constructing `model_cls` fails the test meanwhile.
        name: the registered builder (e.g. "build_osnet_backbone").
        model_cls: the backbone class the builder constructs.
        refused: (DEPTH, other MODEL.BACKBONE keys, exception class, message regex or None).
        accepted: (DEPTH, other MODEL.BACKBONE keys) of a config that passes.
    """
    monkeypatch.setattr(model_cls, "__init__", lambda *args, **kwargs: pytest.fail(f"check_config built {name}"))
    builder = BACKBONE_REGISTRY.get(name)
    depth, opts, error, message = refused
    cfg = family_cfg(name, depth, **opts)
    for check in (builder.check_config, BACKBONE_REGISTRY.check_config):
        with pytest.raises(error, match=message) as caught:
            check(cfg)
        assert "\n" not in str(caught.value)
    good_depth, good_opts = accepted
    builder.check_config(family_cfg(name, good_depth, **good_opts))
