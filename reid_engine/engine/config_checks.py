"""``check_config_values``: every enumerated config value checked before a run writes or loads anything.

Each layer owns the check of its keys (the same lookups its builders use); this module
only runs them together, so a wrong name fails in milliseconds with one line naming
the key, the accepted values and the closest match, and leaves OUTPUT_DIR untouched.
"""
from ..config import CfgNode
from ..data.build import check_data_config
from ..evaluation.distance import check_metric
from ..modeling.meta_arch.build import check_model_config
from ..solver.lr_scheduler import check_lr_scheduler_config
from ..solver.optimizer import check_optimizer_config
from ..utils.checkpoint import CheckpointScheduleError
from ..utils.file_io import check_writable_dir
from ..utils.registry import check_choice
from .hooks.pseudo_labels import check_pseudo_config
from .train_loop import AMP_DTYPE_NAMES

__all__ = ["check_config_values"]


def check_config_values(cfg: CfgNode) -> None:
    """Check the enumerated values of the data, model, solver and test sections.

    Covers SOLVER.AMP.DTYPE, DATASETS.NAMES / TESTS, DATALOADER.SAMPLER_TRAIN, MODEL.META_ARCHITECTURE and
    what the architecture builds (backbone name, depth and norm, head name, pooling,
    classifier, norm and neck feature, MODEL.LOSSES.NAME), SOLVER.OPT,
    SOLVER.CLIP_GRADIENTS.CLIP_TYPE, SOLVER.SCHED, SOLVER.WARMUP_METHOD, TEST.METRIC and
    SOLVER.CHECKPOINT_MAX_TO_KEEP, PSEUDO.*; INPUT.* through the transform builder; and that OUTPUT_DIR
    can be created and written (nothing is created here).

    Args:
        cfg: the full config.
    Raises:
        UnknownChoiceError / ConfigError: the first wrong value, as one line.
        FileWriteError: OUTPUT_DIR has a file in the way or is not writable.
    """
    check_data_config(cfg)
    check_model_config(cfg)
    check_optimizer_config(cfg)
    check_lr_scheduler_config(cfg)
    check_metric(cfg.TEST.METRIC)
    check_choice(cfg.SOLVER.AMP.DTYPE, AMP_DTYPE_NAMES, "SOLVER.AMP.DTYPE")
    check_pseudo_config(cfg)
    _check_checkpoint_config(cfg)
    if cfg.OUTPUT_DIR:
        check_writable_dir(cfg.OUTPUT_DIR, "OUTPUT_DIR")


def _check_checkpoint_config(cfg: CfgNode) -> None:
    keep = cfg.SOLVER.CHECKPOINT_MAX_TO_KEEP
    if not isinstance(keep, int) or keep < 0:
        raise CheckpointScheduleError(
            f"SOLVER.CHECKPOINT_MAX_TO_KEEP must be >= 0, got {keep}: 0 keeps every periodic checkpoint, "
            "N keeps the newest N")
