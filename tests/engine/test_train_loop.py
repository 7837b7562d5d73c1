"""TrainerBase loop semantics, SimpleTrainer steps and metrics, state, AMPTrainer on CPU."""
import gc
import math
import weakref

import pytest
import torch

from reid_engine.engine.train_loop import AMPTrainer, HookBase, SimpleTrainer, write_metrics
from reid_engine.utils.events import EventStorage

from ._engine_fixtures import (  # noqa: F401 (one_torch_thread: autouse fixture)
    NoOpTrainer,
    RecordingHook,
    ResumableStream,
    capture_logs,
    make_trainer,
    one_torch_thread,
)


def test_loop_order_iterations_and_storage_alignment():
    trainer = NoOpTrainer()
    first, second = RecordingHook(), RecordingHook()
    trainer.register_hooks([first, None, second])
    assert trainer._hooks == [first, second]
    with capture_logs() as logs:
        trainer.train(2, 5)
    assert "Starting training from iteration 2" in logs.messages
    assert trainer.iter == 5  # one past the last step after a completed run
    phases = [c[0] for c in first.calls]
    assert phases == ["before_train"] + ["before_step", "after_step"] * 3 + ["after_train"]
    steps = [c for c in first.calls if c[0] in ("before_step", "after_step")]
    assert all(itr == storage_itr for _, itr, storage_itr in steps)
    assert [c[1] for c in steps] == [2, 2, 3, 3, 4, 4]
    assert first.calls[-1] == ("after_train", 5, 5)
    assert first.calls == second.calls


def test_nothing_to_train_is_a_clear_error():
    trainer = NoOpTrainer()
    with pytest.raises(ValueError, match=r"nothing to train: start_iter 10 >= max_iter 10"):
        trainer.train(10, 10)


def test_register_hooks_rejects_non_hooks():
    with pytest.raises(TypeError, match="HookBase"):
        NoOpTrainer().register_hooks([object()])


class _FailAt(HookBase):
    def __init__(self, iteration):
        self.iteration = iteration

    def after_step(self):
        if self.trainer.iter == self.iteration:
            raise RuntimeError("boom")


def test_after_train_runs_when_a_step_raises_and_the_error_propagates():
    trainer = NoOpTrainer()
    recorder = RecordingHook()
    trainer.register_hooks([recorder, _FailAt(3)])
    with capture_logs() as logs, pytest.raises(RuntimeError, match="boom"):
        trainer.train(0, 10)
    assert recorder.calls[-1] == ("after_train", 3, 3)  # iter stays at the failed step
    assert any("Exception during training" in m for m in logs.messages)


def test_hooks_hold_weak_proxies_so_the_trainer_is_collected():
    trainer = make_trainer()
    hook = RecordingHook()
    trainer.register_hooks([hook])
    trainer.train(0, 2)
    assert isinstance(hook.trainer, weakref.ProxyType)
    ref = weakref.ref(trainer)
    gc.disable()  # refcounting alone must free it: there is no reference cycle
    try:
        del trainer
        assert ref() is None
    finally:
        gc.enable()
    with pytest.raises(ReferenceError):
        hook.trainer.iter


def test_simple_trainer_updates_the_model_and_calls_after_backward():
    trainer = make_trainer()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    grads_seen = []

    class GradProbe(HookBase):
        def after_backward(self):
            grads_seen.append(all(p.grad is not None for p in self.trainer.model.parameters()))

    trainer.register_hooks([GradProbe()])
    trainer.train(0, 3)
    assert grads_seen == [True, True, True]
    assert all(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_metrics_keys_and_values():
    trainer = make_trainer(num_losses=2)
    trainer.train(0, 2)
    storage = trainer.storage
    assert set(storage.histories()) == {"data_time", "total_loss", "loss_cls", "loss_reg"}
    latest = storage.latest()
    assert latest["total_loss"][0] == pytest.approx(latest["loss_cls"][0] + latest["loss_reg"][0])
    assert latest["total_loss"][1] == 1

    single = make_trainer(num_losses=1)
    single.train(0, 2)
    assert set(single.storage.histories()) == {"data_time", "total_loss"}

    # fetched every 2 iterations (and after training), every iteration's value at its own iteration
    dense, sparse = make_trainer(), make_trainer(gather_metric_period=2)
    dense.train(0, 5)
    sparse.train(0, 5)
    assert [itr for _, itr in sparse.storage.history("total_loss").values()] == [0, 1, 2, 3, 4]
    assert sparse.storage.history("total_loss").values() == dense.storage.history("total_loss").values()


def test_write_metrics_reduces_over_workers():
    workers = [{"loss_cls": 1.0, "loss_reg": 3.0, "data_time": 0.1},
               {"loss_cls": 3.0, "loss_reg": 5.0, "data_time": 0.3}]
    with EventStorage(start_iter=4) as storage:
        write_metrics(workers)
        write_metrics([])  # what non-main ranks receive from comm.gather: nothing is written
    latest = storage.latest()
    assert latest == {"data_time": (0.3, 4), "total_loss": (6.0, 4), "loss_cls": (2.0, 4), "loss_reg": (4.0, 4)}
    assert storage.history("total_loss").values() == [(6.0, 4)]


def test_nan_loss_raises_naming_the_iteration_and_losses():
    trainer = make_trainer()

    class PoisonAt(HookBase):
        def before_step(self):
            if self.trainer.iter == 2:
                with torch.no_grad():
                    self.trainer.model.head.weight.fill_(float("nan"))

    trainer.register_hooks([PoisonAt()])
    with pytest.raises(FloatingPointError, match=r"iteration 2: loss_cls=nan, loss_reg=nan"):
        trainer.train(0, 5)


class _PoisonAt(HookBase):
    def __init__(self, iteration):
        self.iteration = iteration

    def before_step(self):
        if self.trainer.iter == self.iteration:
            with torch.no_grad():
                self.trainer.model.head.weight.fill_(float("nan"))


def test_delayed_nan_detection_names_the_first_bad_iteration_within_one_period():
    trainer = make_trainer(gather_metric_period=4)
    seen = []

    class Record(HookBase):
        def after_step(self):
            seen.append(self.trainer.iter)

    trainer.register_hooks([_PoisonAt(5), Record()])
    with pytest.raises(FloatingPointError, match=r"iteration 5: loss_cls=nan, loss_reg=nan, seen at iteration 7 "):
        trainer.train(0, 20)
    assert seen == [0, 1, 2, 3, 4, 5, 6]  # stopped at the end of the period holding iteration 5
    assert [itr for _, itr in trainer.storage.history("total_loss").values()] == [0, 1, 2, 3]


def test_a_nan_in_the_last_steps_fails_the_run_without_a_final_evaluation():
    from reid_engine.engine import hooks

    trainer = make_trainer(gather_metric_period=10)
    evaluations = []
    trainer.register_hooks([_PoisonAt(7), hooks.EvalHook(0, lambda: evaluations.append(1) or {})])
    with pytest.raises(FloatingPointError, match="iteration 7"):
        trainer.train(0, 9)  # never reaches a fetch period: the end of training fetches
    assert evaluations == [] and trainer.iter == 8


def test_a_checkpoint_after_a_nan_is_never_written(tmp_path):
    """The periodic checkpointer fetches the staged losses before it saves: the NaN of
    iteration 2 stops the run at iteration 3's save; the iteration-1 checkpoint stays."""
    from reid_engine.engine import hooks
    from reid_engine.utils.checkpoint import Checkpointer

    trainer = make_trainer(gather_metric_period=20)
    checkpointer = Checkpointer(trainer.model, str(tmp_path), trainer=trainer)
    trainer.register_hooks([_PoisonAt(2), hooks.PeriodicCheckpointer(checkpointer, period=2)])
    with pytest.raises(FloatingPointError, match="iteration 2"):
        trainer.train(0, 10)
    assert sorted(p.name for p in tmp_path.glob("*.pth")) == ["model_0000001.pth"]
    saved = torch.load(tmp_path / "model_0000001.pth", weights_only=True)["model"]
    assert all(torch.isfinite(v).all() for v in saved.values() if v.is_floating_point())


def test_steady_state_step_has_no_host_sync(monkeypatch):
    """Between two loss fetches a step reads nothing from a tensor on the host: every
    tensor-to-Python conversion is counted (each would be a device sync on a GPU)."""
    trainer = make_trainer(gather_metric_period=10)
    conversions = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, __name=name, __original=original, **kwargs):
            conversions.append((trainer.iter, __name))
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    trainer.train(0, 10)
    monkeypatch.undo()
    assert conversions and all(itr == 9 for itr, _ in conversions), conversions[:5]  # the flush only
    assert [itr for _, itr in trainer.storage.history("total_loss").values()] == list(range(10))


def test_model_in_eval_mode_or_bad_output_is_a_clear_error():
    trainer = make_trainer()
    trainer.model.eval()
    with pytest.raises(RuntimeError, match="eval mode"):
        trainer.train(0, 1)

    class ReturnsList(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, batch):
            return [self.w.sum()]

    model = ReturnsList()
    bad = SimpleTrainer(model, ResumableStream(), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="dict of losses"):
        bad.train(0, 1)


class _Stateful(HookBase):
    def __init__(self, value=0):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def test_trainer_state_hooks_keyed_by_class_and_unknown_warns():
    trainer = NoOpTrainer()
    trainer.register_hooks([_Stateful(1), RecordingHook(), _Stateful(2)])
    trainer.train(0, 3)
    state = trainer.state_dict()
    assert state["iteration"] == 3
    assert state["hooks"] == {"_Stateful": {"value": 1}, "_Stateful#2": {"value": 2}}
    assert "storage" in state

    other = NoOpTrainer()
    other.register_hooks([_Stateful(), _Stateful()])
    state["hooks"]["Vanished"] = {"x": 1}
    with capture_logs() as logs:
        other.load_state_dict(state)
    assert other.iter == 3 and [h.value for h in other._hooks] == [1, 2]
    assert any("Cannot find the hook 'Vanished'" in m for m in logs.messages)


def _run(trainer, start, stop, losses):
    class Record(HookBase):
        def after_step(self):
            losses.append(self.trainer.storage.latest()["total_loss"][0])

    trainer.register_hooks([Record()])
    trainer.train(start, stop)


def test_simple_trainer_resume_reproduces_the_uninterrupted_run(tmp_path):
    reference_losses = []
    _run(make_trainer(), 0, 8, reference_losses)

    first_losses = []
    first = make_trainer()
    _run(first, 0, 4, first_losses)
    first.iter = 3  # as saved by a checkpoint hook in after_step of iteration 3
    path = tmp_path / "trainer.pth"
    torch.save({"model": first.model.state_dict(), "trainer": first.state_dict()}, path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["trainer"]["data_loader"] == {"position": 4}
    assert set(checkpoint["trainer"]) >= {"iteration", "hooks", "storage", "optimizer", "rng", "data_loader"}

    torch.rand(5)  # disturb the global RNG: the state must be restored
    resumed = make_trainer(lr=0.5)
    resumed.model.load_state_dict(checkpoint["model"])
    resumed.load_state_dict(checkpoint["trainer"])
    assert resumed.optimizer.param_groups[0]["lr"] == 0.1  # restored from the optimizer state
    resumed_losses = []
    _run(resumed, resumed.iter + 1, 8, resumed_losses)
    assert first_losses + resumed_losses == pytest.approx(reference_losses, rel=1e-6)


def test_loader_state_loaded_after_iteration_started_restarts_the_stream():
    trainer = make_trainer()
    trainer.train(0, 2)
    assert trainer.data_loader.position == 2
    trainer.load_state_dict({"iteration": 0, "data_loader": {"position": 0}})
    trainer.train(0, 1)
    assert trainer.data_loader.position == 1


def test_restart_data_stream_makes_the_next_step_iterate_the_loader_afresh():
    trainer = make_trainer()
    trainer.train(0, 2)
    old_stream = trainer._data_loader_iter
    trainer.data_loader.position = 10  # what a hook that changes the loader's stream would do
    trainer.restart_data_stream()
    trainer.train(2, 3)
    assert trainer._data_loader_iter is not old_stream
    assert trainer.data_loader.position == 11  # the new iterator read from the new position


def test_amp_trainer_bfloat16_on_cpu_and_float16_fallback():
    with capture_logs() as logs:
        trainer = make_trainer(trainer_cls=AMPTrainer, precision=torch.float16)
    assert any("bfloat16" in m for m in logs.messages)
    assert trainer.precision == torch.bfloat16 and trainer.grad_scaler is None
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train(0, 3)
    assert trainer.model.last_dtype == torch.bfloat16
    assert all(math.isfinite(v) for v, _ in trainer.storage.history("total_loss").values())
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert "grad_scaler" not in trainer.state_dict()
    with pytest.raises(ValueError, match="use auto, bfloat16 or float16"):
        make_trainer(trainer_cls=AMPTrainer, precision="float32")


@pytest.mark.parametrize("native, precision, autocast", [
    ("", "auto", False), ("", "bfloat16", True), ("AMX", "auto", True), ("AVX512-BF16", "auto", True)])
def test_amp_on_cpu_autocasts_only_where_bfloat16_is_native_or_forced(monkeypatch, native, precision, autocast):
    monkeypatch.setattr("reid_engine.utils.env.cpu_native_bf16", lambda: native)
    with capture_logs() as logs:
        trainer = make_trainer(trainer_cls=AMPTrainer, precision=precision)
    trainer.train(0, 1)
    assert trainer.autocast_enabled is autocast
    assert trainer.model.last_dtype == (torch.bfloat16 if autocast else torch.float32)
    text = "\n".join(logs.messages)
    if native:
        assert f"natively ({native})" in text, text
    else:
        assert "no native bfloat16" in text and ("training runs in float32" in text) is not autocast, text


def test_amp_trainer_scaler_state_round_trip():
    trainer = make_trainer(trainer_cls=AMPTrainer, precision="bfloat16")
    # Exercise the scaling path on CPU (on CUDA, float16 creates this scaler itself).
    trainer.grad_scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
    trainer.train(0, 4)
    state = trainer.state_dict()
    assert state["grad_scaler"]["scale"] == 1024.0  # grew twice, every 2 finite steps
    other = make_trainer(trainer_cls=AMPTrainer, precision="bfloat16")
    other.grad_scaler = torch.amp.GradScaler("cpu")
    other.load_state_dict(state)
    assert other.grad_scaler.get_scale() == 1024.0


def test_storage_of_a_resumed_trainer_is_restored_when_training_starts():
    trainer = make_trainer()
    trainer.train(0, 5)
    state = trainer.state_dict()
    resumed = make_trainer()
    resumed.load_state_dict(state)
    resumed.train(5, 6)
    values = resumed.storage.history("total_loss").values()
    assert [itr for _, itr in values] == [0, 1, 2, 3, 4, 5]
    assert resumed.storage.iter == 6


@pytest.mark.parametrize("cuda_in_use", [True, False])
def test_the_peak_memory_is_reset_once_between_set_up_and_the_first_step(monkeypatch, cuda_in_use):
    """The CUDA path on the CPU (torch.cuda's state and reset stubbed): a run that has touched
    CUDA resets its peak after the hooks' before_train; a CPU run leaves CUDA alone."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda_in_use)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *args: calls.append("reset"))

    class Phases(HookBase):
        def before_train(self):
            calls.append("before_train")

        def before_step(self):
            calls.append("before_step")

    trainer = NoOpTrainer()
    trainer.register_hooks([Phases()])
    trainer.train(0, 2)
    assert calls == ["before_train", *(["reset"] if cuda_in_use else []), "before_step", "before_step"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the real allocator's peak)")
def test_peak_memory_is_reset_before_the_first_iteration():
    """max_mem in the log describes training: memory used while setting up is not counted."""

    class SetUpOnGpu(HookBase):
        def before_train(self):
            scratch = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            del scratch

    held = torch.cuda.memory_allocated()  # what earlier tests of the process may still hold
    trainer = NoOpTrainer()
    trainer.register_hooks([SetUpOnGpu()])
    trainer.train(0, 2)
    assert torch.cuda.max_memory_allocated() < held + (64 << 20)
