"""runtime.compiled: which compiled models replay CUDA graphs, and what that asks of the callers
(a step boundary before each call, a copy of any output kept past the next call).

CPU: ``model.compile`` is lazy (nothing compiles until the first call), and the CPU is added to
``CUDA_GRAPH_DEVICES`` where a test needs a model that counts as replaying CUDA graphs.
"""
import os
import re

import pytest
import torch
from torch import nn

from reid_engine.runtime import compiled
from reid_engine.runtime.compiled import (
    CompileRecord,
    is_compiled,
    kept_output,
    mark_step_begin,
    record_compilation,
    uses_cuda_graphs,
)
from tests.conftest import REPO_ROOT


def _model(mode=None):
    """A linear layer, compiled in place (not yet traced) with `mode` recorded as runtime.compile does."""
    model = nn.Linear(2, 2)
    if mode is not None:
        model.compile(backend="eager")
        record_compilation(model, CompileRecord(mode))
    return model


@pytest.fixture
def marks(monkeypatch):
    """The calls of torch.compiler.cudagraph_mark_step_begin."""
    calls = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append(1))
    return calls


@pytest.fixture
def cpu_replays(monkeypatch):
    """Compiled models on the CPU count as replaying CUDA graphs."""
    monkeypatch.setattr(compiled, "CUDA_GRAPH_DEVICES", ("cuda", "cpu"))


def test_only_the_cuda_graph_modes_on_a_cuda_graph_device_replay(cpu_replays):
    assert not uses_cuda_graphs(_model())  # eager
    assert not uses_cuda_graphs(_model("default"))
    assert not uses_cuda_graphs(_model("max-autotune-no-cudagraphs"))
    for mode in compiled.CUDA_GRAPH_MODES:
        assert uses_cuda_graphs(_model(mode))
        assert uses_cuda_graphs(nn.DataParallel(_model(mode)))  # read through the wrapper
    model = _model("reduce-overhead")
    model._compiled_call_impl = None  # turned back to eager (runtime.compile.uncompile_model)
    assert not is_compiled(model) and not uses_cuda_graphs(model)


def test_on_the_cpu_no_mode_replays_cuda_graphs():
    """The device rule itself: inductor runs no CUDA graph for a model on the CPU."""
    for mode in compiled.CUDA_GRAPH_MODES:
        assert is_compiled(_model(mode)) and not uses_cuda_graphs(_model(mode))


def test_a_step_is_marked_and_an_output_copied_only_under_cuda_graphs(cpu_replays, marks):
    output = torch.arange(4.0)
    for model in (_model(), _model("default")):
        mark_step_begin(model)
        assert kept_output(model, output) is output  # no copy where nothing overwrites it
    assert marks == []
    model = _model("reduce-overhead")
    mark_step_begin(model)
    assert marks == [1]
    kept = kept_output(model, output)
    assert torch.equal(kept, output) and kept.data_ptr() != output.data_ptr()
    output.zero_()  # the next replay writes into the same memory
    assert torch.equal(kept, torch.arange(4.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the real device rule)")
def test_on_cuda_the_cuda_graph_modes_replay():
    model = _model("reduce-overhead").cuda()
    assert uses_cuda_graphs(model) and not uses_cuda_graphs(_model("default").cuda())


#: the compile state and layout as model attributes: set, read or getattr'd (the grep of issue 46)
_ON_A_MODEL = re.compile(r"(?P<owner>[\w.]*)\.(compile_mode|compile_scope|compiled_regions|channels_last)\b"
                         r"|(get|set|has|del)attr\([^)]*[\"'](compile_mode|compile_scope|compiled_regions|channels_last)[\"']")


def test_no_compile_state_is_kept_on_a_model():
    """How a model was compiled is its CompileRecord and its layout its weights': those names appear only
    as the run plan's fields (``plan.x``, the RunPlan's own ``self.x``) and torch's memory format."""
    package = os.path.join(REPO_ROOT, "reid_engine")
    hits = []
    for folder, _, files in os.walk(package):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    for match in _ON_A_MODEL.finditer(line):
                        owner = match.group("owner") or ""
                        plan_field = owner == "plan" or owner.endswith(".plan") or (
                            owner == "self" and path.endswith(os.path.join("runtime", "run_plan.py")))
                        if not (plan_field or owner == "torch"):
                            hits.append(f"{os.path.relpath(path, REPO_ROOT)}:{number}: {line.strip()}")
    assert not hits, "compile state or layout kept on a model:\n" + "\n".join(hits)
