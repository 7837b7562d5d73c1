"""Load ImageNet-pretrained weights from a local file into a backbone.

Accepted files: a plain state dict in torchvision's ResNet layout (`fc.*` is dropped)
or IBN-Net's layout (`bn1.IN.*` / `bn1.BN.*`), optionally wrapped under "state_dict"
or "model" and/or prefixed with "module." (DataParallel). Nothing is downloaded.
"""
import logging
import os
from collections import OrderedDict
from typing import Dict, List, NamedTuple

import torch
from torch import nn

__all__ = ["PretrainLoadResult", "load_pretrained_weights", "summarize_keys"]

logger = logging.getLogger(__name__)

# ImageNet classifier weights have no place in a ReID backbone.
_DROPPED_PREFIXES = ("fc.",)


class PretrainLoadResult(NamedTuple):
    """Outcome of loading: keys copied, keys of the model not in the file, keys of the
    file not in the model, and keys dropped for a shape mismatch."""

    loaded: List[str]
    missing: List[str]
    unexpected: List[str]
    mismatched: List[str]


def summarize_keys(keys: List[str]) -> str:
    """Return keys grouped by module, e.g. 'NL_2.0.g.{weight, bias}', comma-separated."""
    groups: "OrderedDict[str, List[str]]" = OrderedDict()
    for key in keys:
        module, _, leaf = key.rpartition(".")
        groups.setdefault(module, []).append(leaf)
    parts = []
    for module, leaves in groups.items():
        leaf_text = leaves[0] if len(leaves) == 1 else "{" + ", ".join(leaves) + "}"
        parts.append(f"{module}.{leaf_text}" if module else leaf_text)
    return ", ".join(parts)


def _read_state_dict(path: str, config_key: str) -> Dict[str, torch.Tensor]:
    if not path:
        raise ValueError(f"{config_key} is empty; set it to a local torchvision- or "
                         f"IBN-Net-format ResNet weights file (nothing is downloaded)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{config_key}: no file at {path!r}; point it to a local "
                                f"torchvision- or IBN-Net-format ResNet weights file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors are multi-line; keep the first line
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"{config_key}: cannot read {path!r} as a torch weights file "
                           f"({first_line}); save it with torch.save(state_dict)") from exc
    for wrapper in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{config_key}: {path!r} does not hold a state dict of tensors; "
                         f"save the model's state_dict() to it")
    return {key[len("module."):] if key.startswith("module.") else key: value
            for key, value in obj.items()}


def load_pretrained_weights(model: nn.Module, path: str,
                            config_key: str = "MODEL.BACKBONE.PRETRAIN_PATH") -> PretrainLoadResult:
    """Copy matching tensors from the file at `path` into `model` and log the rest.

    Args:
        model: the backbone.
        path: local weights file.
        config_key: the config key named in errors.

    Returns:
        PretrainLoadResult listing loaded, missing, unexpected and mismatched keys.

    Raises:
        FileNotFoundError / ValueError / RuntimeError with one line naming the key.
    """
    source = _read_state_dict(path, config_key)
    target = model.state_dict()
    usable, unexpected, mismatched = {}, [], []
    for key, value in source.items():
        if key.startswith(_DROPPED_PREFIXES):
            continue
        if key not in target:
            unexpected.append(key)
        elif target[key].shape != value.shape:
            mismatched.append(f"{key} {tuple(value.shape)} vs {tuple(target[key].shape)}")
        else:
            usable[key] = value
    model.load_state_dict(usable, strict=False)
    missing = [key for key in target if key not in usable
               and not key.endswith("num_batches_tracked")]
    result = PretrainLoadResult(list(usable), missing, unexpected, mismatched)
    logger.info("Loaded %d pretrained tensors from %s", len(usable), path)
    if missing:
        logger.warning("Not in the pretrained file (keep their initialisation): %s",
                       summarize_keys(missing))
    if unexpected:
        logger.warning("In the pretrained file but unused by the model: %s",
                       summarize_keys(unexpected))
    if mismatched:
        logger.warning("Skipped for a shape mismatch (file vs model): %s", "; ".join(mismatched))
    return result
