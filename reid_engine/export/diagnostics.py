"""Finding what blocks an export: the modules that use an operator, or that cannot be scripted."""
import contextlib
import re
import warnings
from typing import List

import torch
from torch import nn

__all__ = ["modules_using_op", "describe_module", "first_unscriptable", "short_error", "jit_deprecation_silenced"]


@contextlib.contextmanager
def jit_deprecation_silenced():
    """Hide torch's "torch.jit is deprecated" notices: TorchScript output is what was asked for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit", category=DeprecationWarning)
        yield


def modules_using_op(module: nn.Module, example: torch.Tensor, op: str) -> List[str]:
    """Names of the sub-modules whose traced code calls `op` (e.g. "aten::cummax").

    Args:
        module: the module being exported.
        example: an input it accepts.
        op: the qualified operator name.
    Returns:
        dotted module names ("" = the top module), in graph order, without repeats.
    """
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = torch.jit.trace(module, (example,), check_trace=False).inlined_graph
    except Exception:  # the trace itself fails: nothing more to learn
        return []
    names: List[str] = []
    for node in graph.nodes():
        if node.kind() == op:
            # Scopes read "__module.a/__module.a.b": the last part is the innermost module.
            name = node.scopeName().split("/")[-1].replace("__module.", "", 1)
            name = "" if name == "__module" else name
            if name not in names:
                names.append(name)
    return names


def describe_module(root: nn.Module, name: str) -> str:
    """'name (ClassName)' for a sub-module of `root`."""
    module = root.get_submodule(name) if name else root
    return f"{name or '<top module>'} ({type(module).__name__})"


def first_unscriptable(module: nn.Module, name: str = "") -> str:
    """The deepest sub-module that torch.jit.script rejects while all its children compile.

    Args:
        module: a module that fails to script.
        name: its dotted name.
    Returns:
        the dotted name of the culprit.
    """
    for child_name, child in module.named_children():
        try:
            with jit_deprecation_silenced():
                torch.jit.script(child)
        except Exception:
            return first_unscriptable(child, f"{name}.{child_name}" if name else child_name)
    return name


def short_error(exc: BaseException) -> str:
    """The first line of an exporter error plus the source location it points at, if any."""
    text = str(exc).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    where = re.search(r'File "([^"]+)", line (\d+)', text)
    return first.rstrip(":") + (f" ({where.group(1)}, line {where.group(2)})" if where else "")
