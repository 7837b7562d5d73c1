"""Compiling a model in place (torch.compile), turning it back to eager, and running it eagerly for a while.

Which mode a run uses (MODEL.COMPILE: torch.compile's ``default``, ``reduce-overhead`` = CUDA
graphs, ``max-autotune``, ``max-autotune-no-cudagraphs``, plus ``off`` and ``auto``) is the run
plan's decision (``runtime.run_plan``; its mode functions are re-exported here); the engine may
still turn an ``auto`` choice back to eager at run time (a compile error, recompilations, a
compiled step slower than eager), while an explicit mode never falls back. How a model was
compiled is one record (``runtime.compiled.CompileRecord``; nothing is set on the model), made
by :func:`compile_model`, the one place that compiles.

A meta architecture that must not run compiled under ``auto`` says why in its class
attribute ``EAGER_ONLY_REASON`` (a short phrase; None = it compiles).

What is compiled (MODEL.COMPILE_SCOPE, decided by the run plan): the whole model as one graph
(``model``), or only its repeated blocks (``blocks``: every ResNet bottleneck, ViT block,
OSNet block ...; the glue between them runs eager). Blocks of one class and one input shape
share one compiled artifact, so a ResNet-50 compiles eight small graphs instead of one large
one, and a change that meets only some blocks (the release of frozen layers) recompiles only
those (docs/benchmarks.md, "Compiled training").
"""
import contextlib
import os
from collections import Counter
from typing import List

import torch
from torch import nn

from reid_engine.runtime.compiled import CompileRecord, compile_record, compiled_modules, record_compilation
from reid_engine.runtime.run_plan import (
    COMPILE_BACKENDS,
    COMPILE_MODES,
    COMPILE_SCOPES,
    normalize_compile_mode,
    resolve_compile_mode,
)
from reid_engine.utils.comm import unwrap_model
from reid_engine.utils.registry import check_choice

__all__ = ["COMPILE_MODES", "COMPILE_BACKENDS", "COMPILE_SCOPES", "normalize_compile_mode", "resolve_compile_mode",
           "compile_model", "uncompile_model", "eager_calls", "inductor_cache_dir", "disable_eager_methods",
           "repeated_blocks", "compiled_modules", "compile_record"]

#: graph variants one block class may compile (shapes of each stage, first blocks with a
#: downsample, train / eval, with / without gradients); dynamo's default of 8 is for whole models
BLOCK_RECOMPILE_LIMIT = 64


def compile_model(model: nn.Module, mode: str, backend: str = "inductor", scope: str = "model") -> nn.Module:
    """Compile `model` in place (nn.Module.compile), so state_dict keys keep their eager names.

    Args:
        model: the model.
        mode: a torch.compile mode from COMPILE_MODES other than auto / off.
        backend: MODEL.COMPILE_BACKEND; torch.compile's modes only apply to inductor.
        scope: "model" (one graph) or "blocks" (each of :func:`repeated_blocks`; the model as one
            graph when it has none).
    Returns:
        the same model; its :class:`CompileRecord` (``compile_record``) says what was done, and
        :func:`compiled_modules` lists the modules compiled.
    """
    check_choice(backend, COMPILE_BACKENDS, "MODEL.COMPILE_BACKEND")
    check_choice(scope, COMPILE_SCOPES, "MODEL.COMPILE_SCOPE")
    if mode in ("auto", "off"):
        raise ValueError(f"compile_model needs a torch.compile mode, got {mode!r}")
    if backend == "inductor":
        # First: torch's own inductor code sets TORCHINDUCTOR_CACHE_DIR to its /tmp default when
        # it runs before this (importing torch._dynamo below can), and the user's choice would then
        # seem to be torch's.
        inductor_cache_dir()
    disable_eager_methods(model)
    regions = repeated_blocks(model) if scope == "blocks" else []
    if regions:
        config = torch._dynamo.config  # torch < 2.7 names the limit cache_size_limit
        key = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, key, max(getattr(config, key), BLOCK_RECOMPILE_LIMIT))
    options = {"mode": None if mode == "default" else mode} if backend == "inductor" else {"backend": backend}
    # Static shapes: a block class meets a few fixed shapes, each worth its own specialised
    # graph (dynamo would otherwise turn to a slower dynamic-shape graph at the second shape).
    for module in regions or [model]:
        module.compile(dynamic=False, **options)
    record_compilation(model, CompileRecord(mode, "blocks" if regions else "model", list(regions)))
    return model


def repeated_blocks(model: nn.Module) -> List[nn.Module]:
    """The model's repeated blocks: the outermost modules whose class occurs at least twice in it.

    Containers (Sequential, ModuleList, ...) and torch's own layers (Conv2d, BatchNorm2d, ...)
    are never blocks: a block is a class of this package or the user's with its own forward
    (a ResNet bottleneck, a ViT block, an OSNet block, a non-local block).

    Args:
        model: the model.
    Returns:
        the blocks in module order (empty when nothing repeats).
    """
    counts = Counter(type(m) for m in model.modules())
    blocks: List[nn.Module] = []
    inside: set = set()

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if id(child) in inside:
                continue
            if counts[type(child)] >= 2 and _is_block(child):
                blocks.append(child)
                inside.update(id(m) for m in child.modules())
            else:
                visit(child)

    visit(model)
    return blocks


def _is_block(module: nn.Module) -> bool:
    """A module of a class of its own with parameters (not a torch container or layer)."""
    if type(module).__module__.startswith("torch."):
        return False
    return next(module.parameters(), None) is not None


_EAGER_PATCHED = set()


def disable_eager_methods(model: nn.Module) -> None:
    """Make the methods that a module class lists in ``EAGER_METHODS`` run eager in a compiled model.

    Applies ``torch.compiler.disable`` to each, once, on the class that defines it. This happens
    when a model is compiled rather than with a decorator at import time, since any use of
    ``torch.compiler.disable`` imports torch._dynamo (about 1 s of every command's start-up).

    Args:
        model: the model about to be compiled (its submodules are searched too).
    """
    for module in model.modules():
        for name in getattr(type(module), "EAGER_METHODS", ()):
            owner = next(k for k in type(module).__mro__ if name in k.__dict__)
            if (owner, name) not in _EAGER_PATCHED:
                setattr(owner, name, torch.compiler.disable(owner.__dict__[name]))
                _EAGER_PATCHED.add((owner, name))


def inductor_cache_dir() -> str:
    """Where inductor keeps its caches (FX graphs, AOTAutograd, autotuning, Triton kernels).

    TORCHINDUCTOR_CACHE_DIR when the user set it; else ``$XDG_CACHE_HOME/reid_engine/inductor``
    (``~/.cache/reid_engine/inductor``), set for this process and its workers, instead of
    torch's default under /tmp, which a reboot or a fresh container empties. A second run of
    the same model and shapes then loads its compiled graphs instead of compiling them again.

    Returns:
        the cache directory.
    """
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "reid_engine", "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def uncompile_model(model: nn.Module) -> None:
    """Turn a model compiled in place back to eager for good (the weights are shared).

    Args:
        model: the model, DDP-wrapped or not; its compile record's mode becomes "off".
    """
    inner = unwrap_model(model)
    for module in compiled_modules(inner):
        module._compiled_call_impl = None  # what nn.Module.compile set; __call__ then runs forward eagerly
    record = compile_record(inner)
    if record is not None:
        record.mode = "off"


@contextlib.contextmanager
def eager_calls(model: nn.Module):
    """Run the model's calls eagerly inside the block, compiled again after it.

    For work that would only add graphs to a compiled model: PreciseBN's forward passes
    without gradients and with another BatchNorm momentum, or timing eager steps.

    Args:
        model: the model, DDP-wrapped or not (a no-op when it is not compiled).
    """
    inner = unwrap_model(model)
    modules = compiled_modules(inner)
    compiled = [getattr(m, "_compiled_call_impl", None) for m in modules]
    for module in modules:
        module._compiled_call_impl = None
    try:
        yield
    finally:
        record = compile_record(inner)
        if record is None or record.mode != "off":  # unless it was turned to eager for good meanwhile
            for module, call in zip(modules, compiled):
                module._compiled_call_impl = call
