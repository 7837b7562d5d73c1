"""CompileGuard: auto falls back to eager (compile error, recompile storm, slower compiled step),
an explicit mode fails in one line, the decision survives resume; compiled evaluation and
PreciseBN add no graphs. CPU, torch.compile with cheap backends (the eager backend traces and
guards like inductor without generating code)."""
import os

import pytest
import torch
import torch._dynamo  # noqa: F401  (imported once, at collection, rather than inside the first test)
from torch import nn

from reid_engine.engine.hooks import CompileGuard, PreciseBN
from reid_engine.engine.train_loop import HookBase, SimpleTrainer
from reid_engine.evaluation import inference_on_dataset
from reid_engine.runtime import compile_guard
from reid_engine.runtime.compile import eager_calls
from reid_engine.runtime.compile_guard import CompileFailedError, is_compile_error
from reid_engine.runtime.compiled import CompileRecord, compile_record, is_compiled, record_compilation

from ._engine_fixtures import (  # noqa: F401
    CollectFeatures,
    ResumableStream,
    TinyModel,
    capture_logs,
    make_batch,
    make_trainer,
    one_torch_thread,
)

STEPS = 9


@pytest.fixture(autouse=True)
def short_warmup(monkeypatch):
    """One eager step, one compiled warm-up step and two timed ones keep each test to a few steps."""
    monkeypatch.setattr(compile_guard, "EAGER_STEPS", 2)
    monkeypatch.setattr(compile_guard, "COMPILE_WARMUP_STEPS", 1)
    monkeypatch.setattr(compile_guard, "TIMED_STEPS", 2)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _failing_backend(gm, example_inputs):
    raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx")


class StormModel(TinyModel):
    """A forward that reads a Python value changing every step: dynamo guards on it and recompiles.

    (A changing int attribute recompiles only twice: torch then makes it dynamic. A string
    stays a constant to the compiler, like a mode flag or a dict key.)"""

    def __init__(self):
        super().__init__()
        self.phase = "step0"

    def forward(self, batch):
        losses = super().forward(batch)
        scale = 2.0 if self.phase.endswith("7") else 1.0
        return {k: v * scale for k, v in losses.items()}


class PhaseHook(HookBase):
    """Sets StormModel.phase from the iteration before each step."""

    def before_step(self):
        self.trainer.model.phase = f"step{self.trainer.iter}"


def _guarded(trainer, explicit=False, backend="eager", **kwargs):
    """An auto (or explicit) guard over `trainer`'s model compiled with `backend`; the cost rule is
    off (these short runs would stay eager by it; tests/engine/test_compile_cost.py covers it)."""
    trainer.model.compile(backend=backend)
    record_compilation(trainer.model, CompileRecord("default"))
    kwargs.setdefault("weigh_cost", False)
    guard = CompileGuard(trainer.model, "default", explicit=explicit, **kwargs)
    trainer.register_hooks([guard])
    trainer.compile_guard = guard
    return guard


def _weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def test_auto_falls_back_on_a_compile_error_and_redoes_the_step_on_the_same_batch():
    eager = make_trainer()
    eager.train(0, STEPS)
    trainer = make_trainer()
    guard = _guarded(trainer, backend=_failing_backend)
    with capture_logs() as logs:
        trainer.train(0, STEPS)
    assert guard.fell_back and not is_compiled(trainer.model) and compile_record(trainer.model).mode == "off"
    lines = [m for m in logs.messages if "falls back to eager" in m]
    assert len(lines) == 1 and "at iteration 2" in lines[0] and "C++ compiler" in lines[0], logs.messages
    # Nothing lost, nothing applied twice: the same weights, optimizer state and losses as eager training.
    for key, value in _weights(eager).items():
        torch.testing.assert_close(trainer.model.state_dict()[key], value, rtol=0, atol=0)
    assert trainer.optimizer.state_dict()["state"].keys() == eager.optimizer.state_dict()["state"].keys()
    assert trainer.storage.history("total_loss").values() == eager.storage.history("total_loss").values()


def test_an_explicit_mode_fails_on_a_compile_error_in_one_line():
    trainer = make_trainer()
    _guarded(trainer, explicit=True, backend=_failing_backend)
    with pytest.raises(CompileFailedError) as info:
        trainer.train(0, STEPS)
    message = str(info.value)
    assert "\n" not in message and "MODEL.COMPILE default" in message and "MODEL.COMPILE off" in message
    assert "C++ compiler" in message and "iteration 0" in message  # explicit: compiled from the first step
    assert is_compiled(trainer.model)


class FakeClock:
    """Each call advances by `eager` or `compiled` seconds (a timed step spans one advance:
    its second reading)."""

    def __init__(self, model, eager, compiled):
        self.model, self.eager, self.compiled, self.now = model, eager, compiled, 0.0

    def __call__(self):
        self.now += self.compiled if is_compiled(self.model) else self.eager
        return self.now


def _storm_trainer(explicit):
    torch.manual_seed(0)
    model = StormModel()
    trainer = SimpleTrainer(model, ResumableStream(), torch.optim.SGD(model.parameters(), lr=0.1))
    guard = _guarded(trainer, explicit=explicit, recompile_cap=2)
    trainer.register_hooks([PhaseHook()])
    # Recompiling every step also makes the compiled step slower than eager (rule c); a clock
    # that shows it faster leaves the recompilations as the reason to test.
    guard.timer = FakeClock(model, eager=0.1, compiled=0.05)
    return trainer, guard


def test_a_recompile_storm_passes_the_cap_and_auto_falls_back_naming_the_guard():
    trainer, guard = _storm_trainer(explicit=False)
    with capture_logs() as logs:
        trainer.train(0, STEPS)
    assert guard.fell_back and not is_compiled(trainer.model)
    lines = [m for m in logs.messages if "falls back to eager" in m]
    assert len(lines) == 1 and "3 steps recompiled after warm-up (more than 2)" in lines[0], logs.messages
    assert "`self.phase == 'step4'` failed" in lines[0]  # the guard, from torch's recompile reason
    compiles = len(torch._dynamo.utils.get_compilation_metrics())
    trainer.train(STEPS, STEPS + 2)  # eager now: the storm stopped costing compilations
    assert len(torch._dynamo.utils.get_compilation_metrics()) == compiles


def test_a_recompile_storm_fails_an_explicit_mode_in_one_line():
    trainer, _ = _storm_trainer(explicit=True)
    with pytest.raises(CompileFailedError, match=r"^MODEL.COMPILE default: 3 steps recompiled .*self.phase == [^\n]*off"):
        trainer.train(0, STEPS)


@pytest.mark.parametrize("compiled_seconds, falls_back", [(0.3, True), (0.05, False)])
def test_auto_keeps_compile_only_when_the_steady_compiled_step_is_faster(compiled_seconds, falls_back):
    trainer = make_trainer()
    guard = _guarded(trainer)
    guard.timer = FakeClock(trainer.model, eager=0.1, compiled=compiled_seconds)
    with capture_logs() as logs:
        trainer.train(0, STEPS)
    assert not guard.warming_up and guard.fell_back == falls_back and is_compiled(trainer.model) != falls_back
    decision = [m for m in logs.messages if "falls back" in m or "auto keeps" in m]
    assert len(decision) == 1, logs.messages
    if falls_back:
        assert "compiled step (0.3000 s) is slower than the eager step (0.1000 s)" in decision[0]
    else:
        assert "0.0500 s against 0.1000 s eager (2.00x)" in decision[0]
    # The compile time: the first compiled step minus a steady one (here 0: the clock is flat).
    assert guard.compile_seconds == pytest.approx(0.0)
    assert any(m.startswith("Compile: compiling took about") for m in logs.messages)


def test_an_explicit_mode_is_timed_but_never_falls_back_for_speed():
    class WarmupFlags(HookBase):
        flags = []

        def after_step(self):
            self.flags.append(self.trainer.warmup_step)

    trainer = make_trainer()
    guard = _guarded(trainer, explicit=True)
    trainer.register_hooks([WarmupFlags()])
    guard.timer = FakeClock(trainer.model, eager=0.1, compiled=0.3)
    trainer.train(0, STEPS)
    assert not guard.fell_back and is_compiled(trainer.model) and guard.compile_seconds is not None
    assert not guard.warming_up
    # The compiling step is flagged, so the IterationTimer leaves it out of time, ETA and speed.
    assert WarmupFlags.flags == [True] + [False] * (STEPS - 1)


def test_the_fallback_survives_resume_without_compiling_again():
    trainer = make_trainer()
    guard = _guarded(trainer, backend=_failing_backend)
    trainer.train(0, STEPS)
    state = trainer.state_dict()
    assert state["hooks"]["CompileGuard"] == {"mode": "default", "fell_back": True, "reason": guard.reason}
    resumed = make_trainer()
    resumed_guard = _guarded(resumed, backend=_failing_backend)
    with capture_logs() as logs:
        resumed.load_state_dict(state)
    assert resumed_guard.fell_back and not is_compiled(resumed.model)
    assert any("earlier part of this run and stays eager" in m and "C++ compiler" in m for m in logs.messages)
    resumed.train(STEPS, STEPS + 2)  # the failing backend is never called again
    eager = CompileGuard(make_trainer().model, "off", explicit=False)  # e.g. auto resumed on the CPU
    eager.load_state_dict(state["hooks"]["CompileGuard"])
    assert eager.state_dict() == state["hooks"]["CompileGuard"]  # kept for a later compiled resume
    # A run that stayed compiled compares again on resume (another process, maybe another machine).
    kept = make_trainer()
    kept_guard = _guarded(kept)
    kept.load_state_dict({**state, "hooks": {"CompileGuard": {"mode": "default", "fell_back": False, "reason": ""}}})
    kept.train(STEPS, STEPS + 1)
    assert is_compiled(kept.model) and len(kept_guard._eager_times) == 1


def test_a_recompilation_after_the_decision_compares_again_and_can_fall_back():
    """As when FREEZE_LAYERS ends: the new graph is slow where the first was fast."""

    class Release(HookBase):
        def before_step(self):
            self.trainer.model.phase = "frozen" if self.trainer.iter < 7 else "released"

    torch.manual_seed(0)
    model = StormModel()
    trainer = SimpleTrainer(model, ResumableStream(), torch.optim.SGD(model.parameters(), lr=0.1))
    guard = _guarded(trainer)
    trainer.register_hooks([Release()])

    class SlowAfterRelease(FakeClock):
        def __call__(self):
            self.compiled = 0.05 if model.phase == "frozen" else 0.3
            return super().__call__()

    guard.timer = SlowAfterRelease(model, eager=0.1, compiled=0.05)
    with capture_logs() as logs:
        trainer.train(0, 14)
    decisions = [m for m in logs.messages if "falls back" in m or "auto keeps" in m or "comparing" in m]
    assert len(decisions) == 3, logs.messages
    assert "auto keeps" in decisions[0] and "`self.phase == 'frozen'` failed: comparing" in decisions[1]
    assert "compiled step (0.3000 s) is slower than the eager step (0.1000 s)" in decisions[2]
    assert guard.fell_back and not is_compiled(model)


def test_compile_errors_are_told_apart_from_the_model_s_own_errors():
    model = TinyModel()
    model.compile(backend=_failing_backend)
    with pytest.raises(Exception) as info:
        model(make_batch(0))
    assert is_compile_error(info.value)

    class Buggy(TinyModel):
        def forward(self, batch):
            return super().forward(batch) if "y" in batch else batch["labels"]  # a bug eager has too

    model = Buggy()
    model.compile(backend="eager")
    with pytest.raises(KeyError) as info:
        model({"x": torch.zeros(2, 4)})
    assert not is_compile_error(info.value)  # raised in the model's code, through the compiled call
    assert not is_compile_error(ValueError("a bad value")) and not is_compile_error(torch.OutOfMemoryError("oom"))


class FeatureNet(nn.Module):
    """A tiny eval-mode feature extractor over batch dicts with images and camera ids."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.cam = nn.Embedding(3, 4)

    def forward(self, batch):
        x = self.bn(self.conv(batch["images"].float())).mean(dim=(2, 3))
        return x + self.cam(batch["camids"])


def _eval_batches(sizes=(4, 4, 3)):
    gen = torch.Generator().manual_seed(0)
    return [{"images": torch.randint(0, 256, (n, 3, 8, 4), generator=gen, dtype=torch.uint8),
             "camids": torch.randint(0, 3, (n,), generator=gen), "img_paths": [f"{i}.jpg" for i in range(n)]}
            for n in sizes]


@pytest.mark.parametrize("flip", [False, True])
def test_compiled_evaluation_pads_the_last_batch_and_compiles_once(flip):
    torch.manual_seed(0)
    model = FeatureNet()
    expected = inference_on_dataset(model, _eval_batches(), CollectFeatures(), flip_test=flip)["features"]
    model.compile(backend="eager")
    before = len(torch._dynamo.utils.get_compilation_metrics())
    features = inference_on_dataset(model, _eval_batches(), CollectFeatures(), flip_test=flip)["features"]
    assert features.shape == (11, 4)
    torch.testing.assert_close(features, expected)
    compiles = torch._dynamo.utils.get_compilation_metrics()[before:]
    assert len(compiles) == 1 and compiles[0].recompile_reason is None  # the partial batch reused the graph


def test_precise_bn_runs_a_compiled_model_eagerly():
    def bn_stats(compiled):
        torch.manual_seed(0)
        model = TinyModel()
        if compiled:
            model.compile(backend=_failing_backend)  # any compiled call would raise
        bn = model.backbone[1]
        buffers = (bn.running_mean, bn.running_var)
        PreciseBN(0, model, [make_batch(i) for i in range(3)], num_iter=3).update_stats()
        assert is_compiled(model) == compiled
        assert bn.running_mean is buffers[0] and bn.running_var is buffers[1]  # the addresses CUDA graphs use
        return torch.cat([bn.running_mean, bn.running_var])

    torch.testing.assert_close(bn_stats(True), bn_stats(False), rtol=0, atol=0)


def test_eager_calls_restores_the_compiled_call_unless_the_model_fell_back():
    model = TinyModel()
    model.compile(backend="eager")
    with eager_calls(model):
        assert not is_compiled(model)
    assert is_compiled(model)
    record_compilation(model, CompileRecord("default"))
    with eager_calls(model):
        compile_guard.uncompile_model(model)
    assert not is_compiled(model)


@pytest.mark.slow
def test_default_trainer_trains_and_evaluates_compiled(data_root, tmp_path):
    """The real loop, compiled (eager backend): evaluation after compiled training, the guard's
    state in the checkpoint (read by the safe loader) and eager key names for --resume."""
    import logging

    from reid_engine.config import get_cfg
    from reid_engine.engine.defaults import DefaultTrainer
    from reid_engine.utils.safe_load import load_checkpoint_file

    logging.getLogger("reid_engine").setLevel(logging.INFO)
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(os.path.dirname(__file__), "..", "e2e", "configs", "tiny_R18.yml"))
    cfg.merge_from_list(["DATASETS.ROOT", data_root, "OUTPUT_DIR", str(tmp_path), "SOLVER.MAX_EPOCH", 1,
                         "TEST.EVAL_PERIOD", 1, "INPUT.SIZE_TRAIN", "[32, 16]", "INPUT.SIZE_TEST", "[32, 16]",
                         "TEST.IMS_PER_BATCH", 24, "MODEL.COMPILE", "default", "MODEL.COMPILE_BACKEND", "eager",
                         "MODEL.COMPILE_SCOPE", "model"])
    trainer = DefaultTrainer(cfg)
    assert trainer.compile_guard.explicit and is_compiled(trainer.model)
    torch._dynamo.utils.clear_compilation_metrics()
    results = trainer.train()
    # The LR changing every step recompiles nothing; the switch to evaluation recompiles once.
    reasons = [m.recompile_reason for m in torch._dynamo.utils.get_compilation_metrics() if m.recompile_reason]
    assert len(reasons) == 1 and ("grad_mode" in reasons[0] or "training" in reasons[0]), reasons
    assert results and 0 <= results["SyntheticReIDTiny"]["mAP"] <= 100 and is_compiled(trainer.model)
    saved = load_checkpoint_file(str(tmp_path / "model_final.pth"))
    assert saved["trainer"]["hooks"]["CompileGuard"]["fell_back"] is False
    assert not any("_orig_mod" in key for key in saved["model"])


def test_the_inductor_cache_has_a_stable_default_and_the_user_s_choice_wins(monkeypatch, tmp_path):
    from reid_engine.runtime.compile import inductor_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert inductor_cache_dir() == str(tmp_path / "cache" / "reid_engine" / "inductor")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == inductor_cache_dir()  # for torch and worker processes
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert inductor_cache_dir() == str(tmp_path / "mine")


def test_inference_builds_eager_under_auto_and_export_models_always_eager():
    from reid_engine.config import get_cfg
    from reid_engine.inference import build_inference_model
    from reid_engine.runtime.run_plan import build_run_plan, compile_decision

    cuda = torch.device("cuda")
    assert compile_decision("train", "auto", cuda)[0] == "reduce-overhead"
    assert compile_decision("evaluate", "auto", cuda)[0] == "off"  # --eval-only
    assert compile_decision("evaluate", "default", cuda)[0] == "default"  # an explicit mode is kept for --eval-only
    assert compile_decision("serve", "default", cuda)[0] == "off"
    cfg = get_cfg()
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.BACKBONE.DEPTH", "18x", "MODEL.BACKBONE.PRETRAIN", False,
                         "MODEL.HEADS.NUM_CLASSES", 4, "MODEL.COMPILE", "default", "MODEL.COMPILE_BACKEND", "eager"])
    assert build_run_plan(cfg, purpose="evaluate").compile_mode == "default"
    assert not is_compiled(build_inference_model(cfg))  # traced by exporters: never compiled


def test_under_cuda_graphs_each_step_is_marked_and_kept_outputs_are_copies(monkeypatch):
    """The call sites CUDA graphs need, shown on the CPU by declaring the model CUDA-graphed: a
    step boundary before each training step and each evaluation call (two with flip test), and
    evaluation features that are copies, not the memory the next replay overwrites."""
    from reid_engine.runtime import compiled

    marks = []
    monkeypatch.setattr(compiled, "uses_cuda_graphs", lambda model: is_compiled(model))
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    trainer = make_trainer()
    guard = _guarded(trainer, explicit=True)
    trainer.train(0, 3)
    assert len(marks) == 3 and guard._trial == 3  # explicit: compiled from the first step

    returned = []

    class Recording(FeatureNet):
        def forward(self, batch):
            out = super().forward(batch)
            returned.append(out)
            return out

    class Pointers(CollectFeatures):
        def process(self, inputs, outputs):
            assert all(outputs.data_ptr() != r.data_ptr() for r in returned)
            super().process(inputs, outputs)

    model = Recording()
    model.compile(backend="eager")
    for flip, calls in ((False, 1), (True, 2)):
        marks.clear()
        inference_on_dataset(model, _eval_batches(), Pointers(), flip_test=flip)
        assert len(marks) == calls * 3


@pytest.mark.slow
def test_auto_falls_back_when_inductor_finds_no_cpp_compiler(monkeypatch, tmp_path):
    """The real inductor error of a machine without a C++ compiler (inductor lowers the graph first)."""
    import torch._inductor.config as inductor_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(inductor_config.cpp, "cxx", (str(tmp_path / "no-such-g++"),))
    trainer = make_trainer()
    trainer.model.compile()  # inductor
    record_compilation(trainer.model, CompileRecord("default"))
    guard = CompileGuard(trainer.model, "default", explicit=False, weigh_cost=False)
    trainer.register_hooks([guard])
    trainer.compile_guard = guard
    trainer.train(0, 4)
    assert guard.fell_back and "No working C++ compiler" in guard.reason and "at iteration 2" in guard.reason
