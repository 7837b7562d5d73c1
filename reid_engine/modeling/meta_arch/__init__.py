"""Meta architectures: registry, `build_model` and Baseline."""
from .baseline import Baseline
from .build import META_ARCH_REGISTRY, build_model
from .summary import count_flops, count_parameters, log_model_summary

__all__ = ["META_ARCH_REGISTRY", "build_model", "Baseline", "count_flops", "count_parameters",
           "log_model_summary"]
