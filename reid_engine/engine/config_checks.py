"""``check_config_values``: every enumerated config value checked before a run writes or loads anything.

Each layer owns the check of its keys (the same lookups its builders use); this module
only runs them together, so a wrong name fails in milliseconds with one line naming
the key, the accepted values and the closest match, and leaves OUTPUT_DIR untouched.
It checks itself only the keys of the training loop (the checkpoint schedule, the PSEUDO.*
values of the label-free loop).
"""
from typing import Optional

from ..config import CfgNode, ConfigError
from ..data.build import check_data_config
from ..data.pseudo_labels import check_pseudo_loader_config
from ..evaluation.distance import check_metric
from ..modeling.meta_arch.build import check_model_config
from ..modeling.meta_arch.cluster_contrast import check_label_free_architecture
from ..runtime.run_plan import check_plan_config
from ..solver.lr_scheduler import check_lr_scheduler_config
from ..solver.optimizer import check_optimizer_config
from ..utils.checkpoint import CheckpointScheduleError
from ..utils.file_io import check_writable_dir
from .mlflow_tracking import check_mlflow_config

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
    _check_pseudo_values(cfg)
    check_label_free_architecture(cfg)
    check_pseudo_loader_config(cfg)
    _check_checkpoint_config(cfg)
    check_mlflow_config(cfg)
    if cfg.OUTPUT_DIR:
        check_writable_dir(cfg.OUTPUT_DIR, "OUTPUT_DIR")


def _check_checkpoint_config(cfg: CfgNode) -> None:
    keep = cfg.SOLVER.CHECKPOINT_MAX_TO_KEEP
    if not isinstance(keep, int) or keep < 0:
        raise CheckpointScheduleError(
            f"SOLVER.CHECKPOINT_MAX_TO_KEEP must be >= 0, got {keep}: 0 keeps every periodic checkpoint, "
            "N keeps the newest N")


def _positive(value, key: str, integer: bool = False, upper: Optional[float] = None) -> None:
    """Raise a one-line ConfigError unless `value` is a positive number (integer), below `upper` if given."""
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0 or (upper is not None and value >= upper):
        bound = f" and below {upper}" if upper is not None else ""
        raise ConfigError(f"{key} must be a positive {'integer' if integer else 'number'}{bound}, got {value!r}")


def _check_pseudo_values(cfg: CfgNode) -> None:
    """Check the PSEUDO.* values, also when PSEUDO.ENABLED is off (what the label-free loop, the
    clustering and the memories read); the loader and the architecture check theirs when it is on."""
    p = cfg.PSEUDO
    _positive(p.PERIOD, "PSEUDO.PERIOD", integer=True)
    if isinstance(p.ITERS_PER_EPOCH, bool) or not isinstance(p.ITERS_PER_EPOCH, int) or p.ITERS_PER_EPOCH < 0:
        raise ConfigError(f"PSEUDO.ITERS_PER_EPOCH must be an integer >= 0 (0: images // SOLVER.IMS_PER_BATCH), "
                          f"got {p.ITERS_PER_EPOCH!r}")
    _positive(p.EPS, "PSEUDO.EPS (a Jaccard distance)", upper=1.0)
    for key in ("MIN_SAMPLES", "K1", "K2"):
        _positive(p[key], f"PSEUDO.{key}", integer=True)
    if p.K2 > p.K1:
        raise ConfigError(f"PSEUDO.K2 ({p.K2}) must not exceed PSEUDO.K1 ({p.K1}): the query expansion uses the "
                          "k-reciprocal neighbours")
    if isinstance(p.CHUNK_SIZE, bool) or not isinstance(p.CHUNK_SIZE, int) or p.CHUNK_SIZE < 0:
        raise ConfigError(f"PSEUDO.CHUNK_SIZE must be an integer >= 0 (0: automatic), got {p.CHUNK_SIZE!r}")
    for node in ("MEMORY", "CAMERA_PROXY"):
        _positive(p[node].TEMP, f"PSEUDO.{node}.TEMP")
        momentum = p[node].MOMENTUM
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ConfigError(f"PSEUDO.{node}.MOMENTUM must be in [0, 1), got {momentum!r}")
    cam = p.CAMERA_PROXY
    if isinstance(cam.HARD_NEGATIVES, bool) or not isinstance(cam.HARD_NEGATIVES, int) or cam.HARD_NEGATIVES < 0:
        raise ConfigError(f"PSEUDO.CAMERA_PROXY.HARD_NEGATIVES must be an integer >= 0, got {cam.HARD_NEGATIVES!r}")
    if isinstance(cam.WEIGHT, bool) or not isinstance(cam.WEIGHT, (int, float)) or cam.WEIGHT < 0:
        raise ConfigError(f"PSEUDO.CAMERA_PROXY.WEIGHT must be >= 0, got {cam.WEIGHT!r}")
