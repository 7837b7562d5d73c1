"""Meta-architecture registry and `build_model` (MODEL.META_ARCHITECTURE, MODEL.DEVICE)."""
import logging
import time

import torch
from torch import nn

from reid_engine.utils.env import cpu_native_bf16, resolve_device
from reid_engine.utils.registry import Registry, check_choice

from ..compile import COMPILE_BACKENDS, compile_model, inductor_cache_dir, normalize_compile_mode, resolve_compile_mode
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
    """Check every enumerated MODEL value (architecture, backbone, head, losses), building nothing.

    Args:
        cfg: the config tree.
    Raises:
        UnknownChoiceError: an unknown name or value (one line: key, choices, closest).
    """
    META_ARCH_REGISTRY.check_config(cfg)
    check_choice(cfg.MODEL.CHANNELS_LAST, CHANNELS_LAST_CHOICES, "MODEL.CHANNELS_LAST")
    normalize_compile_mode(cfg.MODEL.COMPILE)
    check_choice(cfg.MODEL.COMPILE_BACKEND, COMPILE_BACKENDS, "MODEL.COMPILE_BACKEND")


def build_model(cfg) -> nn.Module:
    """Build the whole model, log its size and FLOPs (counted on the CPU), move it to MODEL.DEVICE.

    Args:
        cfg: the config tree.

    Returns:
        the model, in training mode, on the resolved device.
    """
    name = cfg.MODEL.META_ARCHITECTURE
    META_ARCH_REGISTRY.get(name)  # an unknown name fails before the device check
    device = resolve_device(cfg.MODEL.DEVICE)
    # Building (and loading ImageNet weights) can take a while with nothing else logged.
    logger.info("Building model %s (backbone %s, depth %s) ...", name, cfg.MODEL.BACKBONE.NAME,
                cfg.MODEL.BACKBONE.DEPTH)
    start = time.perf_counter()
    model = META_ARCH_REGISTRY.build(name, cfg)
    # Counted while the model is still on the CPU: tracing on the training device would
    # leave its activations (and cudnn autotuning workspaces) in that device's memory.
    log_model_summary(model, tuple(cfg.INPUT.SIZE_TEST))
    cpu_bf16 = bool(device.type == "cpu" and cfg.SOLVER.AMP.ENABLED and cpu_native_bf16())
    channels_last = use_channels_last(cfg.MODEL.CHANNELS_LAST, device, cpu_bf16=cpu_bf16)
    if cpu_bf16:
        # oneDNN's bfloat16 weight gradient is slow on small maps (layers.cpu_bf16_conv);
        # the converted convolutions are plain nn.Conv2d outside bfloat16 autocast.
        convert_to_matmul_grad_convs(model)
    if channels_last:
        # Still on the CPU: converting on the device would hold a second copy of each weight
        # there while it is converted (a peak of the weights plus the largest one); a weight
        # already in channels_last moves to the device as it is.
        model.to(memory_format=torch.channels_last)
    model.to(device)
    model.channels_last = channels_last  # preprocess_image lays the images out to match
    mode, reason = resolve_compile_mode(cfg.MODEL.COMPILE, device, model)
    if mode != "off":
        # In place (nn.Module.compile): state_dict keys stay free of torch.compile's "_orig_mod." prefix.
        compile_model(model, mode, cfg.MODEL.COMPILE_BACKEND)
    model.compile_mode = mode
    logger.info("Built %s on %s%s%s in %.1f s", name, device, ", channels_last" if channels_last else "",
                ", matrix-product bfloat16 weight gradients on small maps" if cpu_bf16 else "",
                time.perf_counter() - start)
    backend = cfg.MODEL.COMPILE_BACKEND
    cache = f", cache {inductor_cache_dir()}" if backend == "inductor" else ""
    logger.info("Compile: %s (%s)", "eager" if mode == "off" else f"torch.compile mode {mode}, backend {backend}{cache}",
                reason)
    return model


CHANNELS_LAST_CHOICES = ("auto", "on", "off")


def use_channels_last(setting: str, device: torch.device, cpu_bf16: bool = False) -> bool:
    """Whether MODEL.CHANNELS_LAST turns the channels_last memory format on for `device`.

    Args:
        setting: "auto" (on for CUDA, where convolutions are faster in it; on the CPU only with
            ``cpu_bf16``: oneDNN's bfloat16 kernels work in that layout, and the stem's max
            pooling is several times faster in it; float32 CPU training stays contiguous),
            "on" or "off".
        device: the model's device.
        cpu_bf16: the model trains under bfloat16 autocast on a CPU that computes it natively
            (SOLVER.AMP.ENABLED on such a CPU).
    """
    check_choice(setting, CHANNELS_LAST_CHOICES, "MODEL.CHANNELS_LAST")
    if setting != "auto":
        return setting == "on"
    return device.type == "cuda" or (device.type == "cpu" and cpu_bf16)
