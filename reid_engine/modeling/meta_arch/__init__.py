"""Meta architectures: registry, `build_model`, Baseline and MGN."""
from .baseline import Baseline
from .build import META_ARCH_REGISTRY, build_model
from .mgn import MGN
from .summary import count_flops, count_parameters, log_model_summary

__all__ = ["META_ARCH_REGISTRY", "build_model", "Baseline", "MGN", "count_flops", "count_parameters",
           "log_model_summary"]
