"""Compiled training in real CUDA graphs (MODEL.COMPILE reduce-overhead, inductor) on a CUDA device:
eager's losses and an exact resume, evaluation after compiled training, the fp16 ViT path.

The loops' CUDA-graph rules (a step boundary before each compiled call, copies of the outputs
kept past the next call, the padded last evaluation batch, exact resume through the
CompileGuard) run on the CPU in test_cuda_graph_rules.py, with a backend that replays into
static outputs as CUDA graphs do. What is left here needs the GPU itself: graph capture and
replay by torch's cudagraph trees (none skipped), inductor's CUDA kernels matching eager, and
fp16 autocast with a GradScaler inside the graphs.

Skipped without CUDA. Inductor compiles for real here (tens of seconds per model on a cold
cache), so the models are tiny and each test is marked slow.
"""
import copy
import logging
import math
import os
from contextlib import contextmanager

import pytest
import torch

from reid_engine.engine.hooks import CompileGuard
from reid_engine.engine.train_loop import SimpleTrainer
from reid_engine.runtime.compile import compile_model, eager_calls
from reid_engine.runtime.compiled import is_compiled, uses_cuda_graphs

from ._engine_fixtures import ResumableStream, TinyModel, one_torch_thread  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA device (real CUDA graphs, inductor, fp16)")]

TINY_R18 = os.path.join(os.path.dirname(__file__), "..", "e2e", "configs", "tiny_R18.yml")


@pytest.fixture(autouse=True)
def fresh_compiler(monkeypatch):
    """Each test compiles from a clean slate, with deterministic cuDNN and no TF32 (eager and
    compiled then differ only by the order of float additions)."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


class CudaStream(ResumableStream):
    """ResumableStream's batches on the GPU."""

    def __iter__(self):
        for batch in super().__iter__():
            yield {k: v.cuda() for k, v in batch.items()}


def _trainer(compiled: bool) -> SimpleTrainer:
    """TinyModel (Linear, BatchNorm, Linear) with SGD on the GPU; compiled: in CUDA graphs behind
    an explicit-mode CompileGuard (compiled from the first step, never falling back)."""
    torch.manual_seed(0)
    model = TinyModel().cuda()
    trainer = SimpleTrainer(model, CudaStream(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if compiled:
        compile_model(model, "reduce-overhead")
        guard = CompileGuard(model, "reduce-overhead", explicit=True)
        trainer.register_hooks([guard])
        trainer.compile_guard = guard
    return trainer


def _losses(trainer, first=0):
    return [value for value, iteration in trainer.storage.history("total_loss").values() if iteration >= first]


@contextmanager
def _cuda_graph_recordings():
    """Counts the CUDA graphs recorded inside the block (torch's compilation callbacks)."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    box = []

    def count(args):
        if args.callback_trigger == CallbackTrigger.CUDAGRAPH_RECORDING:
            box.append(args.compile_id)

    callback_handler.register_start_callback(count)
    try:
        yield box
    finally:
        callback_handler.remove_start_callback(count)


def test_twenty_steps_in_cuda_graphs_give_the_losses_of_eager_and_resume_exactly():
    eager = _trainer(compiled=False)
    eager.train(0, 20)
    full = _trainer(compiled=True)
    assert uses_cuda_graphs(full.model)
    with _cuda_graph_recordings() as recordings:
        full.train(0, 20)
    assert recordings, "no CUDA graph was recorded"
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0
    assert not full.compile_guard.fell_back and full.compile_guard.compile_seconds is not None
    # The staged losses were copied out of the graphs' memory before the next replay.
    torch.testing.assert_close(torch.tensor(_losses(full)), torch.tensor(_losses(eager)), rtol=1e-3, atol=1e-4)
    for key, value in eager.model.state_dict().items():
        torch.testing.assert_close(full.model.state_dict()[key].float(), value.float(), rtol=1e-3, atol=1e-4)

    half = _trainer(compiled=True)
    half.train(0, 10)
    state, weights = copy.deepcopy(half.state_dict()), copy.deepcopy(half.model.state_dict())
    assert not any("_orig_mod" in key for key in weights)
    resumed = _trainer(compiled=True)
    resumed.model.load_state_dict(weights)
    resumed.load_state_dict(state)
    resumed.train(10, 20)
    assert _losses(resumed, first=10) == _losses(full, first=10)
    for key, value in full.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[key], value, rtol=0, atol=0)


def _default_trainer(tmp_path, data_root, *opts):
    from reid_engine.config import get_cfg
    from reid_engine.engine.defaults import DefaultTrainer

    logging.getLogger("reid_engine").setLevel(logging.INFO)  # else DefaultTrainer sets up logging
    cfg = get_cfg()
    cfg.merge_from_file(TINY_R18)
    # TEST.IMS_PER_BATCH 24: the last evaluation batch is partial (padded under compile).
    cfg.merge_from_list(["MODEL.DEVICE", "cuda", "DATASETS.ROOT", data_root, "OUTPUT_DIR", str(tmp_path),
                         "SOLVER.MAX_EPOCH", 1, "SOLVER.CHECKPOINT_PERIOD", 100, "TEST.EVAL_PERIOD", 1,
                         "TEST.IMS_PER_BATCH", 24, "MODEL.COMPILE", "reduce-overhead", *opts])
    return DefaultTrainer(cfg)


def test_evaluation_runs_after_compiled_training_and_matches_eager_evaluation(tmp_path, data_root):
    trainer = _default_trainer(tmp_path, data_root)
    assert uses_cuda_graphs(trainer.model)
    results = trainer.train()["SyntheticReIDTiny"]
    assert 0.0 <= results["mAP"] <= 100.0 and is_compiled(trainer.model)
    again = trainer.test(trainer.cfg, trainer.model)["SyntheticReIDTiny"]  # the graphs recorded already
    with eager_calls(trainer.model):
        eager = trainer.test(trainer.cfg, trainer.model)["SyntheticReIDTiny"]
    for metric in ("mAP", "Rank-1"):
        assert again[metric] == pytest.approx(results[metric], abs=1e-6)
        assert again[metric] == pytest.approx(eager[metric], abs=0.5)


def test_fp16_vit_trains_and_evaluates_in_cuda_graphs(tmp_path, data_root, monkeypatch):
    from reid_engine.modeling.backbones.vit import VIT_DEPTHS, ViTSpec

    monkeypatch.setitem(VIT_DEPTHS, "tiny", ViTSpec(dim=64, depth=2, heads=2))
    trainer = _default_trainer(
        tmp_path, data_root, "MODEL.META_ARCHITECTURE", "TransReID", "MODEL.BACKBONE.NAME", "build_vit_backbone",
        "MODEL.BACKBONE.DEPTH", "tiny", "MODEL.BACKBONE.STRIDE_SIZE", (12, 12), "MODEL.BACKBONE.NUM_CAMERAS", -1,
        "MODEL.HEADS.POOL_LAYER", "Identity", "MODEL.JPM.NUM_PARTS", 2, "INPUT.SIZE_TRAIN", "[64, 32]",
        "INPUT.SIZE_TEST", "[64, 32]", "SOLVER.AMP.ENABLED", True, "SOLVER.AMP.DTYPE", "float16")
    inner = trainer._trainer
    assert inner.precision == torch.float16 and inner.grad_scaler is not None
    results = trainer.train()["SyntheticReIDTiny"]
    assert 0.0 <= results["mAP"] <= 100.0
    losses = [value for value, _ in trainer.storage.history("total_loss").values()]
    assert losses and all(math.isfinite(v) for v in losses)
    assert math.isfinite(inner.grad_scaler.get_scale()) and not trainer.compile_guard.fell_back
