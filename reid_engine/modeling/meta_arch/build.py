"""Meta-architecture registry and `build_model` (MODEL.META_ARCHITECTURE; device, layout and compilation from the run plan)."""
import logging
import time
from collections import Counter
from typing import Optional

import torch
from torch import nn

from reid_engine.runtime.run_plan import CHANNELS_LAST_CHOICES, RunPlan, build_run_plan, use_channels_last
from reid_engine.utils.registry import Registry

from ...runtime.compile import compile_model, inductor_cache_dir
from ...runtime.compiled import compile_record
from ..layers.cpu_bf16_conv import convert_to_matmul_grad_convs
from .summary import log_model_summary

__all__ = ["META_ARCH_REGISTRY", "build_model", "check_model_config", "use_channels_last", "CHANNELS_LAST_CHOICES"]

logger = logging.getLogger(__name__)

META_ARCH_REGISTRY = Registry("META_ARCH", key="MODEL.META_ARCHITECTURE")
META_ARCH_REGISTRY.__doc__ = """
Meta architectures by MODEL.META_ARCHITECTURE (build contract: utils.registry): nn.Module
classes with a classmethod from_config(cfg) and optionally check_config(cfg), which checks
the keys of the parts the architecture builds. forward(batch dict) returns a dict of named losses in training mode
and features (B, D) in eval mode.
"""


def check_model_config(cfg) -> None:
    """Check every enumerated MODEL value of the architecture (backbone, head, losses), building nothing.

    The layout and compile keys are the run plan's (``runtime.run_plan.check_plan_config``).

    Args:
        cfg: the config tree.
    Raises:
        UnknownChoiceError: an unknown name or value (one line: key, choices, closest).
    """
    META_ARCH_REGISTRY.check_config(cfg)


def _scope_text(model: nn.Module) -> str:
    """"the whole model" or "N repeated blocks (Bottleneck x16)" for the compile log line."""
    record = compile_record(model)
    regions = record.regions if record is not None else []
    if not regions:
        return "the whole model"
    kinds = Counter(type(m).__name__ for m in regions)
    return f"{len(regions)} repeated blocks ({', '.join(f'{k} x{n}' for k, n in kinds.items())})"


def build_model(cfg, plan: Optional[RunPlan] = None) -> nn.Module:
    """Build the whole model, log its size and FLOPs (counted on the CPU), lay it out and compile it as the
    run plan says, and move it to the plan's device.

    Args:
        cfg: the config tree.
        plan: the run plan (device, channels_last, CPU bf16 weight gradients, compile mode); default:
            this process's training plan of `cfg` (``build_run_plan(cfg)``).

    Returns:
        the model, in training mode, on the plan's device.
    """
    name = cfg.MODEL.META_ARCHITECTURE
    META_ARCH_REGISTRY.get(name)  # an unknown name fails before the device check
    plan = plan if plan is not None else build_run_plan(cfg)
    device = plan.device
    # Building (and loading ImageNet weights) can take a while with nothing else logged.
    logger.info("Building model %s (backbone %s, depth %s) ...", name, cfg.MODEL.BACKBONE.NAME,
                cfg.MODEL.BACKBONE.DEPTH)
    start = time.perf_counter()
    model = META_ARCH_REGISTRY.build(name, cfg)
    # Counted while the model is still on the CPU: tracing on the training device would
    # leave its activations (and cudnn autotuning workspaces) in that device's memory.
    log_model_summary(model, tuple(cfg.INPUT.SIZE_TEST))
    if plan.cpu_bf16_weight_grad:
        # oneDNN's bfloat16 weight gradient is slow on small maps (layers.cpu_bf16_conv);
        # the converted convolutions are plain nn.Conv2d outside bfloat16 autocast.
        convert_to_matmul_grad_convs(model)
    if plan.channels_last:
        # Still on the CPU: converting on the device would hold a second copy of each weight
        # there while it is converted (a peak of the weights plus the largest one); a weight
        # already in channels_last moves to the device as it is.
        model.to(memory_format=torch.channels_last)
    model.to(device)  # preprocess_image lays the images out as the weights are (channels_last or not)
    if plan.compiled:
        # In place (nn.Module.compile): state_dict keys stay free of torch.compile's "_orig_mod." prefix.
        compile_model(model, plan.compile_mode, plan.compile_backend, plan.compile_scope)
    logger.info("Built %s on %s%s%s in %.1f s", name, device, ", channels_last" if plan.channels_last else "",
                ", matrix-product bfloat16 weight gradients on small maps" if plan.cpu_bf16_weight_grad else "",
                time.perf_counter() - start)
    backend = plan.compile_backend
    cache = f", cache {inductor_cache_dir()}" if backend == "inductor" else ""
    logger.info("Compile: %s (%s)", "eager" if not plan.compiled else
                f"torch.compile mode {plan.compile_mode}, backend {backend}, "
                f"{_scope_text(model)}{cache}", plan.reasons["compile_mode"])
    return model
