"""What the loops need to know about a model compiled in place (nn.Module.compile).

Kept in the runtime package so that the engine and the evaluation read one rule. CUDA graphs (torch.compile's
``reduce-overhead`` and ``max-autotune`` modes on CUDA) replay into the same output memory: an
output of step N is overwritten by step N + 1, so a caller that keeps an output past the next
call must clone it, and each training or evaluation step starts with
``torch.compiler.cudagraph_mark_step_begin()`` so torch knows the previous step's outputs are
dead (its own rule, "a new compiled call with no backward pending", misses a forward that runs
without a backward, such as evaluation with two calls per batch).
"""
import dataclasses
import sys
import weakref
from typing import List, Optional

import torch
from torch import nn

from ..utils.comm import unwrap_model

__all__ = ["CUDA_GRAPH_MODES", "CUDA_GRAPH_DEVICES", "CompileRecord", "compile_record", "record_compilation",
           "is_compiled", "compiled_modules", "uses_cuda_graphs", "mark_step_begin", "kept_output", "compile_count"]

#: torch.compile modes that run the compiled graphs in CUDA graphs (on CUDA devices)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
#: device types where those modes replay CUDA graphs (a module attribute, so that tests can
#: run the callers' rules on the CPU by adding "cpu")
CUDA_GRAPH_DEVICES = ("cuda",)


@dataclasses.dataclass
class CompileRecord:
    """How a model was compiled in place: the one record of it, kept here rather than as attributes on
    the model. Made by ``runtime.compile.compile_model``; changed only when the model turns back to
    eager for good (``uncompile_model``, the compile guard's fall-back); read by the rules below.

    Attributes:
        mode: the torch.compile mode ("off" once turned back to eager for good).
        scope: "model" (one graph) or "blocks" (its repeated blocks).
        regions: the modules compiled (empty: the model itself).
    """

    mode: str
    scope: str = "model"
    regions: List[nn.Module] = dataclasses.field(default_factory=list)


# One record per compiled model (its unwrapped module), dropped with the model.
_records: "weakref.WeakKeyDictionary[nn.Module, CompileRecord]" = weakref.WeakKeyDictionary()


def compile_record(model: nn.Module) -> Optional[CompileRecord]:
    """The compile record of `model` (DDP-wrapped or not); None when it was never compiled here."""
    return _records.get(unwrap_model(model))


def record_compilation(model: nn.Module, record: CompileRecord) -> None:
    """Keep `record` as how `model` (DDP-wrapped or not) was compiled (``compile_model`` calls it)."""
    _records[unwrap_model(model)] = record


def is_compiled(model: nn.Module) -> bool:
    """Whether the (possibly DDP-wrapped) model's calls run compiled now.

    Args:
        model: a model, wrapped or not.
    Returns:
        True when the module (or its repeated blocks) was compiled in place and not turned back to eager.
    """
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in compiled_modules(model))


def compiled_modules(model: nn.Module) -> List[nn.Module]:
    """The modules of `model` (DDP-wrapped or not) that ``runtime.compile.compile_model``
    compiles: its repeated blocks (its record's ``regions``), or itself.

    Args:
        model: a model, wrapped or not.
    Returns:
        the modules whose calls run compiled when the model is compiled.
    """
    inner = unwrap_model(model)
    record = compile_record(inner)
    return list(record.regions) if record is not None and record.regions else [inner]


def uses_cuda_graphs(model: nn.Module) -> bool:
    """Whether the model's compiled calls replay CUDA graphs (reduce-overhead / max-autotune on CUDA).

    Args:
        model: a model, wrapped or not; its compile record's mode is read.
    Returns:
        True when outputs are overwritten by the next call.
    """
    inner = unwrap_model(model)
    record = compile_record(inner)
    if record is None or record.mode not in CUDA_GRAPH_MODES or not is_compiled(inner):
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
