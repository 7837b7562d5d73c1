"""Compiling a model in place (torch.compile), turning it back to eager, and running it eagerly for a while.

Which mode a run uses (MODEL.COMPILE: torch.compile's ``default``, ``reduce-overhead`` = CUDA
graphs, ``max-autotune``, ``max-autotune-no-cudagraphs``, plus ``off`` and ``auto``) is the run
plan's decision (``config.run_plan``; its mode functions are re-exported here); the engine may
still turn an ``auto`` choice back to eager at run time (a compile error, recompilations, a
compiled step slower than eager), while an explicit mode never falls back. The mode a model
was compiled with is recorded on it by :func:`compile_model` (``compile_mode``), the one
place that compiles, and read by ``utils.compiled``.

A meta architecture that must not run compiled under ``auto`` says why in its class
attribute ``EAGER_ONLY_REASON`` (a short phrase; None = it compiles).
"""
import contextlib
import os

import torch
from torch import nn

from reid_engine.config.run_plan import COMPILE_BACKENDS, COMPILE_MODES, normalize_compile_mode, resolve_compile_mode
from reid_engine.utils.comm import unwrap_model
from reid_engine.utils.registry import check_choice

__all__ = ["COMPILE_MODES", "COMPILE_BACKENDS", "normalize_compile_mode", "resolve_compile_mode", "compile_model",
           "uncompile_model", "eager_calls", "inductor_cache_dir", "disable_eager_methods"]

def compile_model(model: nn.Module, mode: str, backend: str = "inductor") -> nn.Module:
    """Compile `model` in place (nn.Module.compile), so state_dict keys keep their eager names.

    Args:
        model: the model.
        mode: a torch.compile mode from COMPILE_MODES other than auto / off.
        backend: MODEL.COMPILE_BACKEND; torch.compile's modes only apply to inductor.
    Returns:
        the same model.
    """
    check_choice(backend, COMPILE_BACKENDS, "MODEL.COMPILE_BACKEND")
    if mode in ("auto", "off"):
        raise ValueError(f"compile_model needs a torch.compile mode, got {mode!r}")
    disable_eager_methods(model)
    if backend == "inductor":
        inductor_cache_dir()
        model.compile(mode=None if mode == "default" else mode)
    else:
        model.compile(backend=backend)
    model.compile_mode = mode  # what utils.compiled reads (CUDA graphs or not)
    return model


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
        model: the model, DDP-wrapped or not; its ``compile_mode`` becomes "off".
    """
    inner = unwrap_model(model)
    inner._compiled_call_impl = None  # what nn.Module.compile set; __call__ then runs forward eagerly
    inner.compile_mode = "off"


@contextlib.contextmanager
def eager_calls(model: nn.Module):
    """Run the model's calls eagerly inside the block, compiled again after it.

    For work that would only add graphs to a compiled model: PreciseBN's forward passes
    without gradients and with another BatchNorm momentum, or timing eager steps.

    Args:
        model: the model, DDP-wrapped or not (a no-op when it is not compiled).
    """
    inner = unwrap_model(model)
    compiled = getattr(inner, "_compiled_call_impl", None)
    inner._compiled_call_impl = None
    try:
        yield
    finally:
        if getattr(inner, "compile_mode", None) != "off":  # unless it was turned to eager for good meanwhile
            inner._compiled_call_impl = compiled
