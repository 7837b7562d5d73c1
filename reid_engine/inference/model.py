"""An inference-ready model from a config and MODEL.WEIGHTS."""
import logging
from typing import Optional

from torch import nn

from ..config import CfgNode
from ..modeling import build_model
from ..runtime.run_plan import build_run_plan
from ..utils.checkpoint import Checkpointer, load_checkpoint_file

__all__ = [
    "PLACEHOLDER_NUM_CLASSES",
    "checkpoint_num_classes",
    "inference_config",
    "build_inference_model",
]

logger = logging.getLogger(__name__)

# Class count used when neither the config nor the checkpoint gives one; the classifier
# is not used at inference, so any positive value builds a working model.
PLACEHOLDER_NUM_CLASSES = 1
# the classifier of Baseline's head, and of the first of MGN's heads
_CLASSIFIER_KEYS = ("heads.weight", "b1_head.weight")


def checkpoint_num_classes(path: str) -> Optional[int]:
    """Read the number of training classes from a checkpoint's classifier weight.

    The file is read with the same safe loader the Checkpointer uses (no code runs).

    Args:
        path: a checkpoint file (ours, fast-reid's, or a bare state dict).
    Returns:
        rows of the ``heads.weight`` (MGN: ``b1_head.weight``) entry (a ``module.`` prefix is allowed), or None
        when the checkpoint has no such entry.
    """
    state = load_checkpoint_file(path)["model"]
    for key, value in state.items():
        if any(key == k or key.endswith("." + k) for k in _CLASSIFIER_KEYS) and value.ndim == 2:
            return int(value.shape[0])
    return None


def inference_config(cfg: CfgNode) -> CfgNode:
    """Return a frozen copy of `cfg` fit for building an inference model.

    MODEL.BACKBONE.PRETRAIN is switched off (the weights come from MODEL.WEIGHTS), a
    MODEL.HEADS.NUM_CLASSES of 0 is filled from the checkpoint's classifier (so the
    whole checkpoint loads without shape warnings), else with a placeholder. Whether the model
    is compiled is the run plan's decision (purpose "evaluate" or "serve"), not the config's.

    Args:
        cfg: the user's config (not modified).
    Returns:
        the adjusted, frozen clone.
    """
    cfg = cfg.clone()
    cfg.defrost()
    cfg.MODEL.BACKBONE.PRETRAIN = False
    if cfg.MODEL.HEADS.NUM_CLASSES <= 0:
        found = checkpoint_num_classes(cfg.MODEL.WEIGHTS) if cfg.MODEL.WEIGHTS else None
        cfg.MODEL.HEADS.NUM_CLASSES = found or PLACEHOLDER_NUM_CLASSES
    cfg.freeze()
    return cfg


def build_inference_model(cfg: CfgNode) -> nn.Module:
    """Build the model of `cfg`, load MODEL.WEIGHTS and switch it to eval mode.

    Args:
        cfg: the config (MODEL.* and INPUT.SIZE_TEST are read by the model builder).
    Returns:
        the model on MODEL.DEVICE, in eval mode, without gradients, eager: the run plan's "serve"
        purpose (exporters trace this model, and a served model's calls come one batch at a time).
    """
    cfg = inference_config(cfg)
    model = build_model(cfg, build_run_plan(cfg, purpose="serve"))
    if cfg.MODEL.WEIGHTS:
        Checkpointer(model).load(cfg.MODEL.WEIGHTS, checkpointables=[])
    else:
        logger.warning("MODEL.WEIGHTS is empty: the model keeps its random initial weights; "
                       "pass MODEL.WEIGHTS path/to/model_final.pth for meaningful features")
    model.eval()
    model.requires_grad_(False)
    return model
