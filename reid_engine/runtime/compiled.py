"""What the loops need to know about a model compiled in place (nn.Module.compile).

Kept in the runtime package so that the engine and the evaluation read one rule. CUDA graphs (torch.compile's
``reduce-overhead`` and ``max-autotune`` modes on CUDA) replay into the same output memory: an
output of step N is overwritten by step N + 1, so a caller that keeps an output past the next
call must clone it, and each training or evaluation step starts with
``torch.compiler.cudagraph_mark_step_begin()`` so torch knows the previous step's outputs are
dead (its own rule, "a new compiled call with no backward pending", misses a forward that runs
without a backward, such as evaluation with two calls per batch).
"""
import sys
from typing import List

import torch
from torch import nn

from ..utils.comm import unwrap_model

__all__ = ["CUDA_GRAPH_MODES", "CUDA_GRAPH_DEVICES", "is_compiled", "compiled_modules", "uses_cuda_graphs",
           "mark_step_begin", "kept_output", "compile_count"]

#: torch.compile modes that run the compiled graphs in CUDA graphs (on CUDA devices)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
#: device types where those modes replay CUDA graphs (a module attribute, so that tests can
#: run the callers' rules on the CPU by adding "cpu")
CUDA_GRAPH_DEVICES = ("cuda",)


def is_compiled(model: nn.Module) -> bool:
    """Whether the (possibly DDP-wrapped) model's calls run compiled now.

    Args:
        model: a model, wrapped or not.
    Returns:
        True when the module (or its repeated blocks) was compiled in place and not turned back to eager.
    """
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in compiled_modules(model))


def compiled_modules(model: nn.Module) -> List[nn.Module]:
    """The modules of `model` (DDP-wrapped or not) that ``modeling.compile.compile_model``
    compiles: its repeated blocks (recorded on the model as ``compiled_regions``), or itself.

    Args:
        model: a model, wrapped or not.
    Returns:
        the modules whose calls run compiled when the model is compiled.
    """
    inner = unwrap_model(model)
    return list(getattr(inner, "compiled_regions", None) or [inner])


def uses_cuda_graphs(model: nn.Module) -> bool:
    """Whether the model's compiled calls replay CUDA graphs (reduce-overhead / max-autotune on CUDA).

    Args:
        model: a model, wrapped or not; its ``compile_mode`` (recorded by modeling.compile.compile_model) is read.
    Returns:
        True when outputs are overwritten by the next call.
    """
    inner = unwrap_model(model)
    if not is_compiled(inner) or getattr(inner, "compile_mode", None) not in CUDA_GRAPH_MODES:
        return False
    param = next(inner.parameters(), None)
    return param is not None and param.device.type in CUDA_GRAPH_DEVICES


def mark_step_begin(model: nn.Module) -> None:
    """Tell CUDA graphs that a new step begins (outputs of earlier calls may be overwritten).

    A no-op unless the model runs in CUDA graphs.

    Args:
        model: a model, wrapped or not.
    """
    if uses_cuda_graphs(model):
        torch.compiler.cudagraph_mark_step_begin()


def kept_output(model: nn.Module, output: torch.Tensor) -> torch.Tensor:
    """`output` of `model`, safe to keep past the model's next call (cloned under CUDA graphs).

    Args:
        model: the model that produced it, wrapped or not.
        output: a tensor it returned.
    Returns:
        the tensor itself, or a clone when the next replay would overwrite it.
    """
    return output.clone() if uses_cuda_graphs(model) else output


def compile_count() -> int:
    """Graphs torch.compile has compiled in this process (dynamo's own counter; 0 before anything
    imported dynamo, which this does not import)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0
