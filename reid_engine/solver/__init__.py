"""Optimizers (parameter groups, gradient clipping) and per-iteration lr schedules."""
from .lr_scheduler import ParamSchedulerLR, build_lr_scheduler
from .optimizer import add_gradient_clipping, build_optimizer, get_param_groups, is_norm_module

__all__ = ["build_optimizer", "build_lr_scheduler", "ParamSchedulerLR", "add_gradient_clipping",
           "get_param_groups", "is_norm_module"]
