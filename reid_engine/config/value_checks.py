"""Checks of the config keys that no other package owns: the checkpoint schedule and the PSEUDO.* values
of the label-free loop (``engine.config_checks.check_config_values`` runs them with every package's own)."""
from typing import Optional

from .config import CfgNode, ConfigError

__all__ = ["check_checkpoint_config", "check_pseudo_values"]


def check_checkpoint_config(cfg: CfgNode) -> None:
    """Check SOLVER.CHECKPOINT_MAX_TO_KEEP (an integer >= 0)."""
    from ..utils.checkpoint import CheckpointScheduleError  # here: utils.checkpoint imports torch

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


def check_pseudo_values(cfg: CfgNode) -> None:
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
