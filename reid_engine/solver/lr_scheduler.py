"""``build_lr_scheduler``: warmup then multi-step or (delayed) cosine decay, per iteration.

Reads SOLVER.SCHED, BASE_LR, MAX_EPOCH, STEPS, GAMMA, DELAY_EPOCHS, ETA_MIN_LR,
WARMUP_METHOD, WARMUP_FACTOR and WARMUP_ITERS. Epoch counts are converted to iterations
with the ``iters_per_epoch`` the trainer passes. The schedule is a product of fvcore
param schedulers giving a multiplier of each parameter group's initial lr, so groups
keep their ratios (HEADS_LR_FACTOR, BIAS_LR_FACTOR).
"""
import logging
from typing import List

import torch
from fvcore.common.param_scheduler import (
    CompositeParamScheduler,
    ConstantParamScheduler,
    CosineParamScheduler,
    ExponentialParamScheduler,
    LinearParamScheduler,
    MultiStepParamScheduler,
    ParamScheduler,
)
from torch.optim.lr_scheduler import LRScheduler

from reid_engine.config import ConfigError
from reid_engine.utils.registry import lookup

__all__ = ["ParamSchedulerLR", "build_lr_scheduler", "check_lr_scheduler_config", "SCHEDULER_NAMES",
           "WARMUP_METHODS"]

logger = logging.getLogger(__name__)

# Largest `where` handed to fvcore: ConstantParamScheduler rejects where == 1.0, and a
# scheduler stepped past the last iteration must keep the final value.
_LAST_WHERE = 1.0 - 1e-9


class ParamSchedulerLR(LRScheduler):
    """Sets each group's lr to its initial lr times ``multiplier(iteration / max_iter)``.

    Stepped once per iteration; ``multiplier`` is an fvcore ``ParamScheduler`` over
    progress in [0, 1]; iterations past ``max_iter`` keep the final value.

    Args:
        optimizer: the optimizer whose groups are updated.
        multiplier: fvcore ParamScheduler giving the lr factor.
        max_iter: number of iterations the multiplier spans.
        last_epoch: index of the last iteration run (-1 for a fresh start).
    """

    # Attributes written by state_dict(): plain numbers only, so a checkpoint loads
    # with torch.load(weights_only=True); the multiplier is rebuilt from the config.
    _STATE_KEYS = ("last_epoch", "base_lrs", "_last_lr", "_step_count", "max_iter")

    def __init__(self, optimizer: torch.optim.Optimizer, multiplier: ParamScheduler, max_iter: int,
                 last_epoch: int = -1):
        if max_iter < 1:
            raise ValueError(f"ParamSchedulerLR: max_iter must be >= 1, got {max_iter}")
        self.multiplier = multiplier
        self.max_iter = int(max_iter)
        super().__init__(optimizer, last_epoch)

    def factor(self, iteration: int) -> float:
        """The lr multiplier at ``iteration``."""
        where = min(max(iteration, 0) / self.max_iter, _LAST_WHERE)
        return float(self.multiplier(where))

    def get_lr(self) -> List[float]:
        """Learning rates of the groups at iteration ``last_epoch``."""
        factor = self.factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]

    def state_dict(self) -> dict:
        """Iteration counter and base lrs (plain numbers)."""
        return {key: getattr(self, key) for key in self._STATE_KEYS}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`; the next ``step`` continues the saved sequence."""
        missing = [key for key in ("last_epoch", "base_lrs") if key not in state_dict]
        if missing:
            raise KeyError(f"scheduler state lacks {missing}; pass the dict from ParamSchedulerLR.state_dict()")
        saved_max_iter = state_dict.get("max_iter", self.max_iter)
        if saved_max_iter != self.max_iter:
            logger.warning("Scheduler state was saved for %d iterations, the config now gives %d; "
                           "continuing with the new length", saved_max_iter, self.max_iter)
        for key in self._STATE_KEYS:
            if key in state_dict and key != "max_iter":
                setattr(self, key, state_dict[key])


# ---- the decay part ----------------------------------------------------------------

def _multistep(solver, max_iter: int, iters_per_epoch: int) -> ParamScheduler:
    """1, then times GAMMA at each of STEPS (epochs), as a function of global progress."""
    steps = [int(step) for step in solver.STEPS]
    if any(later <= earlier for earlier, later in zip(steps, steps[1:])) or any(s <= 0 for s in steps):
        raise ConfigError(f"SOLVER.STEPS must be positive and increasing epochs, got {list(solver.STEPS)}")
    milestones = [step * iters_per_epoch for step in steps if step * iters_per_epoch < max_iter]
    if len(milestones) < len(steps):
        logger.warning("SOLVER.STEPS %s: steps at or after MAX_EPOCH %s are never reached",
                       steps, solver.MAX_EPOCH)
    values = [solver.GAMMA ** k for k in range(len(milestones) + 1)]
    if not milestones:
        return ConstantParamScheduler(1.0)
    return MultiStepParamScheduler(values, num_updates=max_iter, milestones=milestones)


def _cosine(solver, max_iter: int, iters_per_epoch: int) -> ParamScheduler:
    """1 until DELAY_EPOCHS, then cosine down to ETA_MIN_LR / BASE_LR at the last iteration."""
    end = solver.ETA_MIN_LR / solver.BASE_LR
    delay = solver.DELAY_EPOCHS * iters_per_epoch
    if not 0 <= solver.DELAY_EPOCHS < solver.MAX_EPOCH:
        raise ConfigError(f"SOLVER.DELAY_EPOCHS must be in [0, MAX_EPOCH={solver.MAX_EPOCH}), "
                          f"got {solver.DELAY_EPOCHS}")
    cosine = CosineParamScheduler(1.0, end)
    if delay == 0:
        return cosine
    return CompositeParamScheduler([ConstantParamScheduler(1.0), cosine],
                                   lengths=[delay / max_iter, 1.0 - delay / max_iter],
                                   interval_scaling=["rescaled", "rescaled"])


_SCHEDULERS = {"MultiStepLR": _multistep, "CosineAnnealingLR": _cosine}
SCHEDULER_NAMES = tuple(_SCHEDULERS)


# ---- warmup --------------------------------------------------------------------------

def _linear_warmup(start: float, end: float) -> ParamScheduler:
    return LinearParamScheduler(start, end)


def _constant_warmup(start: float, end: float) -> ParamScheduler:
    return ConstantParamScheduler(start)


def _exp_warmup(start: float, end: float) -> ParamScheduler:
    # start * (end / start) ** t: geometric growth from start to end
    return ExponentialParamScheduler(start, end / start)


_WARMUPS = {"linear": _linear_warmup, "constant": _constant_warmup, "exp": _exp_warmup}
WARMUP_METHODS = tuple(_WARMUPS)


def _with_warmup(main: ParamScheduler, solver, max_iter: int):
    """Prefix ``main`` with WARMUP_ITERS of warmup from WARMUP_FACTOR * main(0) to main(end of warmup).

    Returns:
        tuple: (multiplier, iterations it spans). A warmup longer than the run keeps
        its slope and is cut at the last iteration.
    """
    warmup_iters = int(solver.WARMUP_ITERS)
    make_warmup = lookup(_WARMUPS, solver.WARMUP_METHOD, "SOLVER.WARMUP_METHOD")
    if warmup_iters < 0:
        raise ConfigError(f"SOLVER.WARMUP_ITERS must be >= 0, got {warmup_iters}")
    if warmup_iters == 0:
        return main, max_iter
    if not solver.WARMUP_FACTOR > 0:
        raise ConfigError(f"SOLVER.WARMUP_FACTOR must be > 0, got {solver.WARMUP_FACTOR}")
    if warmup_iters >= max_iter:
        logger.warning("SOLVER.WARMUP_ITERS (%d) covers the whole run (%d iterations); the lr never "
                       "reaches its full value", warmup_iters, max_iter)
        return make_warmup(solver.WARMUP_FACTOR, 1.0), warmup_iters
    fraction = warmup_iters / max_iter
    warmup = make_warmup(solver.WARMUP_FACTOR * main(0.0), main(fraction))
    return CompositeParamScheduler([warmup, main], lengths=[fraction, 1.0 - fraction],
                                   interval_scaling=["rescaled", "fixed"]), max_iter


def check_lr_scheduler_config(cfg) -> None:
    """Check SOLVER.SCHED and SOLVER.WARMUP_METHOD, building nothing.

    Args:
        cfg: the config.
    Raises:
        UnknownChoiceError: an unknown name (one line: key, choices, closest).
    """
    lookup(_SCHEDULERS, cfg.SOLVER.SCHED, "SOLVER.SCHED")
    lookup(_WARMUPS, cfg.SOLVER.WARMUP_METHOD, "SOLVER.WARMUP_METHOD")


def build_lr_scheduler(cfg, optimizer: torch.optim.Optimizer, iters_per_epoch: int) -> ParamSchedulerLR:
    """Build the per-iteration lr schedule of the config.

    Args:
        cfg: the config (SOLVER.* schedule keys are read).
        optimizer: its groups' current lrs are the base lrs.
        iters_per_epoch: iterations in one epoch, to convert MAX_EPOCH, STEPS and DELAY_EPOCHS.

    Returns:
        ParamSchedulerLR: call ``step()`` once after every iteration.
    """
    solver = cfg.SOLVER
    if iters_per_epoch < 1:
        raise ConfigError(f"iters_per_epoch must be >= 1, got {iters_per_epoch}; the training set "
                          f"must hold at least SOLVER.IMS_PER_BATCH images")
    make_schedule = lookup(_SCHEDULERS, solver.SCHED, "SOLVER.SCHED")
    if solver.MAX_EPOCH < 1:
        raise ConfigError(f"SOLVER.MAX_EPOCH must be >= 1, got {solver.MAX_EPOCH}")
    max_iter = int(solver.MAX_EPOCH * iters_per_epoch)
    main = make_schedule(solver, max_iter, iters_per_epoch)
    multiplier, span = _with_warmup(main, solver, max_iter)
    logger.info("LR schedule: %s warmup over %d iterations, then %s over %d iterations",
                solver.WARMUP_METHOD, solver.WARMUP_ITERS, solver.SCHED, max_iter)
    return ParamSchedulerLR(optimizer, multiplier, span)
