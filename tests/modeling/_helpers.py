"""Shared helpers of the modeling tests: small configs."""
from reid_engine.config import get_cfg


def tiny_cfg(depth="18x", **overrides):
    """A CPU config for a small ResNet model with 64x32 test images.

    Args:
        depth: MODEL.BACKBONE.DEPTH.
        overrides: flat "SECTION.KEY" (under MODEL.) -> value, e.g. {"HEADS.WITH_BNNECK": True}.
    """
    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.DEPTH = depth
    cfg.MODEL.HEADS.NUM_CLASSES = 5
    cfg.INPUT.SIZE_TEST = [64, 32]
    cfg.INPUT.SIZE_TRAIN = [64, 32]
    for key, value in overrides.items():
        node = cfg.MODEL
        *path, leaf = key.split(".")
        for part in path:
            node = getattr(node, part)
        setattr(node, leaf, value)
    return cfg
