"""How a config adapts to the run: iterations per epoch, class and camera counts from the training set,
and batch size, learning rate and iteration-counted keys scaled to the number of workers.

Plain functions of the config; ``DefaultTrainer``'s ``compute_iters_per_epoch``,
``auto_scale_hyperparams`` and ``auto_scale_workers`` (its override points) call them.
"""
import logging

from ..config import CfgNode

__all__ = ["iters_per_epoch", "scale_to_training_set", "scale_to_world_size"]

# The name these lines have had in log.txt since they were logged from engine/defaults.py.
logger = logging.getLogger("reid_engine.engine.defaults")


def iters_per_epoch(cfg: CfgNode, num_train_images: int) -> int:
    """Iterations per epoch: training images // global batch (at least 1), or
    PSEUDO.ITERS_PER_EPOCH in label-free training (the images trained on change with the clusters)."""
    if cfg.PSEUDO.ENABLED and cfg.PSEUDO.ITERS_PER_EPOCH > 0:
        return int(cfg.PSEUDO.ITERS_PER_EPOCH)
    return max(1, num_train_images // cfg.SOLVER.IMS_PER_BATCH)


def scale_to_training_set(cfg: CfgNode, num_classes: int, num_cameras: int = 0) -> CfgNode:
    """Fill MODEL.HEADS.NUM_CLASSES from the training set (when left at 0), and
    MODEL.BACKBONE.NUM_CAMERAS when it is -1 (a ViT's camera embedding).

    Args:
        cfg: the config (not modified).
        num_classes: identities in the (merged) training set.
        num_cameras: cameras in the (merged) training set.
    Returns:
        a frozen copy of the config with NUM_CLASSES (and NUM_CAMERAS) set.
    """
    cfg = cfg.clone()
    frozen = cfg.is_frozen()
    cfg.defrost()
    if cfg.MODEL.HEADS.NUM_CLASSES > 0 and cfg.MODEL.HEADS.NUM_CLASSES != num_classes:
        logger.warning(
            f"MODEL.HEADS.NUM_CLASSES = {cfg.MODEL.HEADS.NUM_CLASSES} in the config, but the training set "
            f"has {num_classes} identities; using {num_classes}."
        )
    cfg.MODEL.HEADS.NUM_CLASSES = num_classes
    logger.info(f"Auto-scaling the config: MODEL.HEADS.NUM_CLASSES = {num_classes}")
    if cfg.MODEL.BACKBONE.NUM_CAMERAS == -1:
        cfg.MODEL.BACKBONE.NUM_CAMERAS = int(num_cameras)
        logger.info(f"Auto-scaling the config: MODEL.BACKBONE.NUM_CAMERAS = {num_cameras}")
    if frozen:
        cfg.freeze()
    return cfg


def scale_to_world_size(cfg: CfgNode, num_workers: int) -> CfgNode:
    """Scale batch size, LR and iteration-counted keys to the number of workers.

    With SOLVER.REFERENCE_WORLD_SIZE > 0 and != num_workers, IMS_PER_BATCH and
    BASE_LR are multiplied by num_workers / reference, and keys counted in
    iterations (WARMUP_ITERS, FREEZE_ITERS) are divided by it; keys counted in
    epochs stay, since an epoch then has fewer iterations by itself.

    Args:
        cfg: the config (not modified).
        num_workers: the actual world size.
    Returns:
        the same config when nothing changes, else a scaled copy.
    """
    old_world_size = cfg.SOLVER.REFERENCE_WORLD_SIZE
    if old_world_size == 0 or old_world_size == num_workers:
        return cfg
    cfg = cfg.clone()
    frozen = cfg.is_frozen()
    cfg.defrost()
    scale = num_workers / old_world_size
    bs = cfg.SOLVER.IMS_PER_BATCH = int(round(cfg.SOLVER.IMS_PER_BATCH * scale))
    lr = cfg.SOLVER.BASE_LR = cfg.SOLVER.BASE_LR * scale
    warmup = cfg.SOLVER.WARMUP_ITERS = int(round(cfg.SOLVER.WARMUP_ITERS / scale))
    freeze = cfg.SOLVER.FREEZE_ITERS = int(round(cfg.SOLVER.FREEZE_ITERS / scale))
    cfg.SOLVER.REFERENCE_WORLD_SIZE = num_workers
    logger.info(
        f"Auto-scaling the config to {num_workers} workers (reference {old_world_size}): "
        f"IMS_PER_BATCH={bs}, BASE_LR={lr}, WARMUP_ITERS={warmup}, FREEZE_ITERS={freeze}."
    )
    if frozen:
        cfg.freeze()
    return cfg
