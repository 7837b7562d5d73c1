"""Shared helpers of the RegNet and EfficientNet tests: configs, builds, and checks that an
ImageNet file in a release layout loads completely."""
import re

import torch

from ._backbone_family import assert_fully_loaded, build
from ._backbone_family import family_cfg as backbone_cfg  # noqa: F401 (re-exported for the tests)
from ._backbone_family import with_running_stats as with_random_statistics  # noqa: F401


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
    assert_fully_loaded(source, loaded, path, logs)
