"""What CUDA graphs ask of the training and evaluation loops (runtime/compiled.py), checked on the CPU.

Under CUDA graphs (MODEL.COMPILE reduce-overhead or max-autotune on a GPU) a compiled graph
replays into the same output memory at every call, and each step starts with
``torch.compiler.cudagraph_mark_step_begin()``. :class:`ReplayingBackend` gives a compiled CPU
model the same output lifetimes, and the model is declared CUDA-graphed (compile mode
reduce-overhead, the CPU added to ``runtime.compiled.CUDA_GRAPH_DEVICES``), so the trainer, the
CompileGuard and the evaluator take their real CUDA-graph branches. Each test here fails if a
caller keeps a model output without copying it, or calls the model without marking the step.

What needs the GPU itself (graph capture, inductor's kernels, fp16) is in test_compile_cuda.py.
"""
import copy
import itertools

import pytest
import torch
import torch._dynamo  # noqa: F401  (imported once, at collection, rather than inside the first test)
import torch.nn.functional as F
from torch import nn
from torch._dynamo.backends.registry import lookup_backend

from reid_engine.engine.hooks import CompileGuard
from reid_engine.engine.train_loop import SimpleTrainer
from reid_engine.evaluation import inference_on_dataset
from reid_engine.runtime import compiled
from reid_engine.runtime.compile import eager_calls
from reid_engine.runtime.compiled import CompileRecord, record_compilation, uses_cuda_graphs

from ._engine_fixtures import CollectFeatures, make_trainer, one_torch_thread  # noqa: F401 (autouse fixture)


def _into_static(static: dict, index: int, value):
    """`value` written into the static tensor of its output position and shape, which is returned."""
    if not isinstance(value, torch.Tensor):
        return value
    buffer = static.setdefault((index, value.shape, value.dtype), torch.empty_like(value))
    if not value.requires_grad:
        return buffer.copy_(value)
    # A fresh alias of the static memory (same storage and version counter) through which the
    # gradient flows back into the graph.
    return buffer.detach().copy_(value)


class ReplayingBackend:
    """A torch.compile backend with the output lifetimes of CUDA graphs, on any device.

    Each graph it compiles writes its outputs into static tensors (one per output position and
    shape) and returns those, so an output of one call is overwritten by the next call of the
    same graph, as a CUDA graph replay overwrites it. Gradients flow as through the graph.

    Attributes:
        inner: the backend that compiles each graph ("eager", or "aot_eager" for AOTAutograd's
            forward and backward graphs, which inductor compiles too).
        events: "mark" (a step boundary) and "replay" (a compiled call), in order.
        graphs: graphs compiled so far (CUDA graphs record one per graph and input shape).
        output_shapes: the shapes of the static outputs.
    """

    def __init__(self, inner: str = "eager"):
        self.inner = inner
        self.events = []
        self.graphs = 0
        self.output_shapes = set()

    def mark_step_begin(self) -> None:
        """Stands in for torch.compiler.cudagraph_mark_step_begin."""
        self.events.append("mark")

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        run = gm.forward if self.inner == "eager" else lookup_backend(self.inner)(gm, example_inputs)
        static = {}

        def replay(*args):
            self.events.append("replay")
            outputs = run(*args)
            self.output_shapes.update(tuple(o.shape) for o in outputs if isinstance(o, torch.Tensor))
            return type(outputs)(_into_static(static, i, o) for i, o in enumerate(outputs))

        return replay


@pytest.fixture
def cuda_graphs(monkeypatch):
    """A ReplayingBackend whose log receives the step marks; compiled CPU models count as CUDA-graphed."""
    backend = ReplayingBackend()
    monkeypatch.setattr(compiled, "CUDA_GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", backend.mark_step_begin)
    torch._dynamo.reset()
    yield backend
    torch._dynamo.reset()


def _replayed(model: nn.Module, backend: ReplayingBackend) -> nn.Module:
    """`model` compiled in place with `backend`, its mode recorded as runtime.compile.compile_model records it."""
    model.compile(backend=backend)
    record_compilation(model, CompileRecord("reduce-overhead"))
    assert uses_cuda_graphs(model)
    return model


def _guard(trainer) -> CompileGuard:
    """An explicit-mode CompileGuard running the trainer's steps (compiled from the first step)."""
    guard = CompileGuard(trainer.model, "reduce-overhead", explicit=True)
    trainer.register_hooks([guard])
    trainer.compile_guard = guard
    return guard


def _replayed_trainer(backend: ReplayingBackend) -> SimpleTrainer:
    """make_trainer's TinyModel in replayed graphs behind a CompileGuard, losses fetched every 5 steps."""
    trainer = make_trainer(gather_metric_period=5)
    _replayed(trainer.model, backend)
    _guard(trainer)
    return trainer


def _history(trainer, name: str = "total_loss", first: int = 0):
    return [value for value, iteration in trainer.storage.history(name).values() if iteration >= first]


def test_training_stages_copies_of_the_losses_and_marks_each_compiled_step(cuda_graphs):
    steps = 14
    eager = make_trainer(gather_metric_period=5)
    eager.train(0, steps)
    trainer = _replayed_trainer(cuda_graphs)
    trainer.train(0, steps)
    assert cuda_graphs.events == ["mark", "replay"] * steps  # one boundary right before each compiled call
    assert cuda_graphs.graphs == 1 and not trainer.compile_guard.fell_back
    # Up to five steps are staged before a fetch: each keeps its own losses, not the last replay's.
    assert len(set(_history(eager))) == steps
    for name in ("total_loss", "loss_cls", "loss_reg"):
        assert _history(trainer, name) == _history(eager, name)
    for key, value in eager.model.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[key], value), key


def test_resume_under_replayed_graphs_is_exact(cuda_graphs):
    cuda_graphs.inner = "aot_eager"  # AOTAutograd's forward and backward graphs, as inductor gets them
    full = _replayed_trainer(cuda_graphs)
    full.train(0, 20)
    half = _replayed_trainer(cuda_graphs)
    half.train(0, 10)
    state, weights = copy.deepcopy(half.state_dict()), copy.deepcopy(half.model.state_dict())
    assert not any("_orig_mod" in key for key in weights)
    resumed = _replayed_trainer(cuda_graphs)
    resumed.model.load_state_dict(weights)
    resumed.load_state_dict(state)
    resumed.train(10, 20)
    assert _history(resumed, first=10) == _history(full, first=10)
    for key, value in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


class EmbedNet(nn.Module):
    """Features of uint8 images and camera ids (conv, BatchNorm, embedding) in eval mode; a
    classification loss on them in training."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.cam = nn.Embedding(3, 4)
        self.classifier = nn.Linear(4, 3)

    def forward(self, batch):
        features = self.bn(self.conv(batch["images"].float() / 255)).mean(dim=(2, 3)) + self.cam(batch["camids"])
        if not self.training:
            return features
        return {"loss_cls": F.cross_entropy(self.classifier(features), batch["targets"])}


def _batches(sizes, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [{"images": torch.randint(0, 256, (n, 3, 8, 4), generator=gen, dtype=torch.uint8),
             "camids": torch.randint(0, 3, (n,), generator=gen), "targets": torch.randint(0, 3, (n,), generator=gen)}
            for n in sizes]


def _evaluate(model, flip: bool) -> torch.Tensor:
    """The features of 11 images in batches of 4, 4 and 3 (a partial last batch)."""
    return inference_on_dataset(model, _batches((4, 4, 3)), CollectFeatures(), flip_test=flip)["features"]


@pytest.mark.parametrize("flip", [False, True], ids=["plain", "flip"])
def test_evaluation_keeps_copies_drops_the_padding_and_marks_each_call(cuda_graphs, flip):
    torch.manual_seed(0)
    model = EmbedNet()
    expected = _evaluate(model, flip)  # eager: no padding, nothing overwritten
    _replayed(model, cuda_graphs)
    features = _evaluate(model, flip)
    assert features.shape == (11, 4)
    torch.testing.assert_close(features, expected)
    # The 3-image batch ran padded in the 4-image graph; a step boundary before every call
    # (flip test: the first call's output is copied before the mirrored batch's call).
    assert cuda_graphs.graphs == 1 and cuda_graphs.output_shapes == {(4, 4)}
    assert cuda_graphs.events == ["mark", "replay"] * (2 if flip else 1) * 3


def test_evaluation_after_replayed_training_matches_eager_evaluation(cuda_graphs):
    torch.manual_seed(0)
    model = _replayed(EmbedNet(), cuda_graphs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = SimpleTrainer(model, itertools.cycle(_batches((8,) * 3, seed=1)), optimizer, gather_metric_period=4)
    _guard(trainer)
    trainer.train(0, 8)
    assert cuda_graphs.graphs == 1
    first = _evaluate(model, flip=True)
    assert cuda_graphs.graphs == 2 and model.training  # the eval-mode graph; training mode restored
    again = _evaluate(model, flip=True)
    assert cuda_graphs.graphs == 2  # its graph recorded already
    with eager_calls(model):
        eager = _evaluate(model, flip=True)
    assert torch.equal(again, first)
    torch.testing.assert_close(first, eager)
