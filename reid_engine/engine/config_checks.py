"""``check_config_values``: every enumerated config value checked before a run writes or loads anything.

Each layer owns the check of its keys (the same lookups its builders use); this module
only runs them together, so a wrong name fails in milliseconds with one line naming
the key, the accepted values and the closest match, and leaves OUTPUT_DIR untouched.
The keys no other package owns (the checkpoint schedule, the PSEUDO.* values of the label-free
loop) are checked by ``config.value_checks``.
"""
from ..config import CfgNode
from ..config.value_checks import check_checkpoint_config, check_pseudo_values
from ..data.build import check_data_config
from ..data.pseudo_labels import check_pseudo_loader_config
from ..evaluation.distance import check_metric
from ..integrations.mlflow import check_mlflow_config
from ..modeling.meta_arch.build import check_model_config
from ..modeling.meta_arch.cluster_contrast import check_label_free_architecture
from ..runtime.run_plan import check_plan_config
from ..solver.lr_scheduler import check_lr_scheduler_config
from ..solver.optimizer import check_optimizer_config
from ..utils.file_io import check_writable_dir

__all__ = ["check_config_values"]


def check_config_values(cfg: CfgNode) -> None:
    """Check the enumerated values of the data, model, solver and test sections.

    Covers the run plan's keys (MODEL.CHANNELS_LAST, MODEL.COMPILE(_BACKEND), SOLVER.AMP.DTYPE),
    DATASETS.NAMES / TESTS, DATALOADER.SAMPLER_TRAIN, MODEL.META_ARCHITECTURE and
    what the architecture builds (backbone name, depth and norm, head name, pooling,
    classifier, norm and neck feature, MODEL.LOSSES.NAME), SOLVER.OPT,
    SOLVER.CLIP_GRADIENTS.CLIP_TYPE, SOLVER.SCHED, SOLVER.WARMUP_METHOD, TEST.METRIC and
    SOLVER.CHECKPOINT_MAX_TO_KEEP, PSEUDO.*, MLFLOW.*; INPUT.* through the transform builder; and that OUTPUT_DIR
    can be created and written (nothing is created here).

    Args:
        cfg: the full config.
    Raises:
        UnknownChoiceError / ConfigError: the first wrong value, as one line.
        MissingPackageError: MLFLOW.ENABLED without mlflow installed.
        FileWriteError: OUTPUT_DIR has a file in the way or is not writable.
    """
    check_data_config(cfg)
    check_model_config(cfg)
    check_plan_config(cfg)
    check_optimizer_config(cfg)
    check_lr_scheduler_config(cfg)
    check_metric(cfg.TEST.METRIC)
    check_pseudo_values(cfg)
    check_label_free_architecture(cfg)
    check_pseudo_loader_config(cfg)
    check_checkpoint_config(cfg)
    check_mlflow_config(cfg)
    if cfg.OUTPUT_DIR:
        check_writable_dir(cfg.OUTPUT_DIR, "OUTPUT_DIR")
