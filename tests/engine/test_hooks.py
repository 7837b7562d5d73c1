"""Every hook, including the reference numbers of engine-behaviour.md."""
import json
import os
import re

import pytest
import torch

from reid_engine.engine import hooks
from reid_engine.engine.train_loop import HookBase
from reid_engine.integrations.event_writers import JSONWriter
from reid_engine.utils.checkpoint import Checkpointer
from reid_engine.utils.events import CommonMetricPrinter

from ._engine_fixtures import (  # noqa: F401 (one_torch_thread: autouse fixture)
    NoOpTrainer,
    TinyModel,
    capture_logs,
    make_batch,
    make_trainer,
    one_torch_thread,
)


def _eval_calls(max_iter, period):
    calls = []
    trainer = NoOpTrainer()
    trainer.register_hooks([hooks.EvalHook(period, lambda: calls.append(trainer.iter) or {"m": 1.0})])
    trainer.train(0, max_iter)
    return calls


@pytest.mark.parametrize("max_iter,period,expected", [(30, 15, 2), (31, 15, 3), (20, 0, 1)])
def test_eval_hook_call_counts(max_iter, period, expected):
    assert len(_eval_calls(max_iter, period)) == expected


def test_eval_hook_iterations_and_flattened_results():
    assert _eval_calls(31, 15) == [14, 29, 31]  # after_train sees iter == max_iter
    trainer = NoOpTrainer()
    trainer.register_hooks([hooks.EvalHook(0, lambda: {"Market": {"Rank-1": 0.9, "mAP": torch.tensor(0.7)}})])
    trainer.train(0, 3)
    latest = trainer.storage.latest()
    assert latest["Market/Rank-1"] == (0.9, 3)
    assert latest["Market/mAP"][0] == pytest.approx(0.7)
    assert trainer.storage.smoothing_hints()["Market/mAP"] is False


def test_eval_hook_rejects_non_floats_and_skips_failed_runs():
    trainer = NoOpTrainer()
    trainer.register_hooks([hooks.EvalHook(0, lambda: {"a": {"b": "high"}})])
    with pytest.raises(ValueError, match="nested dict of floats; got 'a/b: 'high''"):
        trainer.train(0, 2)

    calls = []

    class Fail(HookBase):
        def after_step(self):
            if self.trainer.iter == 1:
                raise RuntimeError("step failed")

    failing = NoOpTrainer()
    eval_hook = hooks.EvalHook(0, lambda: calls.append(1) or {"m": 1.0})
    failing.register_hooks([eval_hook, Fail()])
    with pytest.raises(RuntimeError, match="step failed"):
        failing.train(0, 5)
    assert calls == []  # training did not complete: no final evaluation
    assert eval_hook._func is None  # released after training


def test_reference_run_json_and_console_lines(tmp_path):
    """50 iterations, EvalHook period 0, PeriodicWriter period 20."""
    json_path = str(tmp_path / "metrics.json")
    trainer = make_trainer()
    scheduler = torch.optim.lr_scheduler.StepLR(trainer.optimizer, step_size=10, gamma=0.5)
    trainer.register_hooks([
        hooks.IterationTimer(),
        hooks.LRScheduler(scheduler=scheduler),
        hooks.EvalHook(0, lambda: {"Synthetic": {"metric": 0.5}}),
        hooks.PeriodicWriter([CommonMetricPrinter(50), JSONWriter(json_path)], period=20),
    ])
    with capture_logs() as logs:
        trainer.train(0, 50)
    with open(json_path) as f:
        lines = [json.loads(line) for line in f]
    assert [line["iteration"] for line in lines] == [19, 39, 49, 50]
    assert lines[-1] == {"iteration": 50, "Synthetic/metric": 0.5}
    assert {"total_loss", "loss_cls", "loss_reg", "time", "data_time", "lr"} <= set(lines[0])
    assert lines[0]["lr"] == pytest.approx(0.1 * 0.5)  # lr of iteration 19, before stepping
    assert lines[2]["lr"] == pytest.approx(0.1 * 0.5**4)

    console = [m for m in logs.messages if re.search(r"\biter: \d+", m)]
    assert [int(re.search(r"iter: (\d+)", m).group(1)) for m in console] == [19, 39, 49]
    assert console[-1].startswith("eta: 0:00:00  iter: 49  total_loss: ")
    assert re.match(r"^eta: \d+:\d\d:\d\d  iter: 19  total_loss: \S+  loss_cls: \S+  loss_reg: \S+  "
                    r"time: \d\.\d{4}  data_time: \d\.\d{4}  lr: 0\.05$", console[0]), console[0]
    assert any(m.startswith("Overall training speed: 47 iterations in ") for m in logs.messages)
    assert any(re.match(r"Total training time: \d+:\d\d:\d\d \(\d+:\d\d:\d\d on hooks\)", m) for m in logs.messages)


class _FakeCheckpointer:
    def __init__(self):
        self.saved = []

    def save(self, name, **extra):
        self.saved.append((name, extra["iteration"]))

    def has_checkpoint(self):
        return False


def _run_best(values, mode, start_iter=0, best_state=None):
    """4 evaluations (period 1, 4 iterations) producing ``values``; returns the hook."""
    checkpointer = _FakeCheckpointer()
    trainer = NoOpTrainer()
    results = iter(values)
    best = hooks.BestCheckpointer(1, checkpointer, "val/metric", mode=mode)
    trainer.register_hooks([hooks.EvalHook(1, lambda: {"val": {"metric": next(results)}}), best])
    if best_state is not None:
        trainer.load_state_dict({"iteration": start_iter, "hooks": {"BestCheckpointer": best_state}})
    trainer.train(start_iter, start_iter + len(values))
    return best, checkpointer.saved


@pytest.mark.parametrize("values,mode,saves", [
    ([0.3, 0.4, 0.35, 0.5], "max", 3),
    ([1.0, 0.8, 0.9, 0.9], "min", 2),
    ([float("nan"), 0.8, 0.9, 0.9], "min", 1),
])
def test_best_checkpointer_reference_numbers(values, mode, saves):
    best, saved = _run_best(values, mode)
    assert len(saved) == saves
    assert all(name == "model_best" for name, _ in saved)


def test_best_checkpointer_ignores_inf_and_survives_resume():
    best, saved = _run_best([float("inf"), 0.6, float("-inf"), 0.4], "max")
    assert saved == [("model_best", 1)] and best.best_metric == 0.6
    state = best.state_dict()
    assert state == {"best_metric": 0.6, "best_iter": 1}
    # resumed run: values below the restored best are not saved
    resumed, saved = _run_best([0.5, 0.7, 0.65, 0.2], "max", start_iter=4, best_state=state)
    assert saved == [("model_best", 5)] and resumed.best_metric == 0.7


def test_best_checkpointer_keeps_last_checkpoint_on_the_periodic_file(tmp_path):
    trainer = make_trainer()
    checkpointer = Checkpointer(trainer.model, str(tmp_path), trainer=trainer)
    metrics = iter([0.1, 0.2, 0.3])
    trainer.register_hooks([hooks.EvalHook(2, lambda: {"val": {"metric": next(metrics)}}),
                            hooks.BestCheckpointer(2, checkpointer, "val/metric"),
                            hooks.PeriodicCheckpointer(checkpointer, period=2)])
    trainer.train(0, 6)
    assert (tmp_path / "model_best.pth").exists()
    assert torch.load(tmp_path / "model_best.pth", weights_only=True)["iteration"] == 6  # the final evaluation
    assert open(tmp_path / "last_checkpoint").read() == "model_final.pth"


def test_best_checkpointer_warns_when_metric_missing():
    checkpointer = _FakeCheckpointer()
    trainer = NoOpTrainer()
    trainer.register_hooks([hooks.EvalHook(0, lambda: {"other": 1.0}),
                            hooks.BestCheckpointer(0, checkpointer, "val/metric")])
    with capture_logs() as logs:
        trainer.train(0, 2)
    assert checkpointer.saved == []
    assert any("'val/metric' was not written" in m for m in logs.messages)
    with pytest.raises(ValueError, match="'max' or 'min'"):
        hooks.BestCheckpointer(1, checkpointer, "m", mode="best")


def _lr_run(trainer, start, stop, state=None):
    scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda it: 0.9**it)
    trainer.register_hooks([hooks.LRScheduler()])
    trainer.scheduler = scheduler  # the hook falls back to trainer.scheduler / trainer.optimizer
    if state is not None:
        trainer.load_state_dict(state)
    trainer.train(start, stop)
    return [v for v, _ in trainer.storage.history("lr").values()][-(stop - start):]


def test_lr_scheduler_hook_records_before_stepping_and_resumes():
    reference = _lr_run(make_trainer(), 0, 10)
    assert reference == pytest.approx([0.1 * 0.9**i for i in range(10)])
    first = make_trainer()
    head = _lr_run(first, 0, 6)
    first.iter = 5
    state = first.state_dict()
    assert state["hooks"]["LRScheduler"]["last_epoch"] == 6
    tail = _lr_run(make_trainer(), 6, 10, state=state)
    assert head + tail == pytest.approx(reference)


def test_lr_scheduler_best_param_group():
    a, b, c = (torch.nn.Parameter(torch.zeros(1)) for _ in range(3))
    opt = torch.optim.SGD([{"params": [a], "lr": 1.0}, {"params": [b, c], "lr": 2.0}], lr=1.0)
    assert hooks.LRScheduler.get_best_param_group_id(opt) == 1
    opt = torch.optim.SGD([{"params": [a], "lr": 1.0}, {"params": [b], "lr": 2.0}, {"params": [c], "lr": 2.0}])
    assert hooks.LRScheduler.get_best_param_group_id(opt) == 1  # most common lr


def _freeze_run(start, stop, freeze_iters=3, reset_train_mode=False):
    """Train with the backbone frozen; returns (trainer, per-step 'backbone changed' flags)."""
    trainer = make_trainer()
    freeze = hooks.LayerFreeze(trainer.model, ["backbone"], freeze_iters)
    changed, snapshot, bn_modes = [], {}, []

    class Watch(HookBase):
        def before_step(self):
            snapshot["params"] = [p.detach().clone() for p in self.trainer.model.backbone.parameters()]
            snapshot["stats"] = self.trainer.model.backbone[1].running_mean.clone()
            bn_modes.append(self.trainer.model.backbone[1].training)

        def after_step(self):
            after = list(self.trainer.model.backbone.parameters())
            moved = any(not torch.equal(a, b) for a, b in zip(snapshot["params"], after))
            moved_stats = not torch.equal(snapshot["stats"], self.trainer.model.backbone[1].running_mean)
            changed.append((moved, moved_stats))
            if reset_train_mode:
                self.trainer.model.train()  # as evaluation does when it restores the mode

    trainer.register_hooks([freeze, Watch()])
    with capture_logs() as logs:
        trainer.train(start, stop)
    return trainer, changed, bn_modes, logs.messages


def test_layer_freeze_keeps_params_and_bn_fixed_then_releases():
    trainer, changed, bn_modes, logs = _freeze_run(0, 6, reset_train_mode=True)
    assert changed == [(False, False)] * 3 + [(True, True)] * 3
    assert bn_modes == [False] * 3 + [True] * 3
    assert any("Releasing the frozen layers ['backbone'] at iteration 3" in m for m in logs)
    head_changes = trainer.model.head.weight  # the head trained all along
    assert head_changes.grad is not None


def test_layer_freeze_resumed_mid_freeze_and_after_release():
    _, changed, _, _ = _freeze_run(2, 5)
    assert changed == [(False, False), (True, True), (True, True)]
    _, changed, bn_modes, logs = _freeze_run(4, 6)
    assert changed == [(True, True)] * 2 and bn_modes == [True, True]
    assert not any("Freezing" in m for m in logs)


def test_layer_freeze_unknown_prefix_is_a_clear_error():
    with pytest.raises(ValueError, match=r"match no module.*backbone, head"):
        hooks.LayerFreeze(TinyModel(), ["backbon"], 3)


def _bn_batches():
    index = 0
    while True:
        yield make_batch(10_000 + index, batch_size=16)
        index += 1


def test_precise_bn_recomputes_statistics():
    trainer = make_trainer()
    bn = trainer.model.backbone[1]
    precise = hooks.PreciseBN(0, trainer.model, _bn_batches(), num_iter=4)
    seen = []

    class Snapshot(HookBase):
        def after_step(self):
            seen.append(bn.running_mean.clone())

    trainer.register_hooks([Snapshot(), precise])
    trainer.train(0, 3)
    assert not torch.allclose(seen[-1], bn.running_mean)  # recomputed after the last step
    # the recomputed mean is the population mean of the BN inputs over the 4 batches
    batches = [make_batch(10_000 + i, batch_size=16)["x"] for i in range(4)]
    with torch.no_grad():
        expected = torch.cat([trainer.model.backbone[0](x) for x in batches]).mean(0)
    assert torch.allclose(bn.running_mean, expected, atol=1e-5)
    assert "total_loss" in trainer.storage.latest()  # PreciseBN's forward passes left no metrics behind


def test_precise_bn_disabled_without_bn_in_training_mode():
    with capture_logs() as logs:
        precise = hooks.PreciseBN(1, TinyModel(with_bn=False), _bn_batches(), num_iter=2)
    assert any("PreciseBN is disabled" in m for m in logs.messages)
    precise.update_stats()  # a no-op, not an error


def test_periodic_checkpointer_hook_files(tmp_path):
    trainer = make_trainer()
    checkpointer = Checkpointer(trainer.model, str(tmp_path), trainer=trainer)
    trainer.register_hooks([hooks.PeriodicCheckpointer(checkpointer, period=4)])
    trainer.train(0, 10)
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".pth"))
    assert names == ["model_0000003.pth", "model_0000007.pth", "model_final.pth"]
    saved = torch.load(tmp_path / "model_final.pth", weights_only=True)
    assert saved["iteration"] == 9 and saved["trainer"]["iteration"] == 9
    assert open(tmp_path / "last_checkpoint").read() == "model_final.pth"


def test_iteration_timer_and_callback_hook():
    order = []
    callback = hooks.CallbackHook(before_train=lambda t: order.append("bt"), before_step=lambda t: order.append(t.iter),
                                  after_step=lambda t: order.append("as"), after_train=lambda t: order.append("at"))
    trainer = make_trainer()
    trainer.register_hooks([hooks.IterationTimer(warmup_iter=3), callback])
    with capture_logs() as logs:
        trainer.train(0, 5)
    assert order == ["bt", 0, "as", 1, "as", 2, "as", 3, "as", 4, "as", "at"]
    assert callback._after_step is None  # dropped after training
    times = trainer.storage.history("time").values()
    assert [itr for _, itr in times] == [3, 4] and all(v > 0 for v, _ in times)
    assert any(m.startswith("Overall training speed: 2 iterations in 0:00:00 (") for m in logs.messages)


def test_torch_profiler_writes_traces(tmp_path):
    trainer = make_trainer()
    trainer.register_hooks([hooks.TorchProfiler(lambda t: t.iter == 1, str(tmp_path))])
    trainer.train(0, 3)
    trace = tmp_path / "profiler-trace-iter1.json"
    assert sorted(p.name for p in tmp_path.glob("profiler-trace-iter*.json")) == ["profiler-trace-iter1.json"]
    assert "traceEvents" in json.loads(trace.read_text())
    tb_files = list((tmp_path / "log" / "profiler-tensorboard-iter1").glob("worker0.*.pt.trace.json"))
    assert len(tb_files) == 1


def test_torch_memory_stats_is_a_no_op_without_cuda():
    trainer = NoOpTrainer()
    memory = hooks.TorchMemoryStats(period=1, max_runs=2)
    trainer.register_hooks([memory])
    with capture_logs() as logs:
        trainer.train(0, 5)
    if not torch.cuda.is_available():
        assert memory._runs == 0 and not any("allocated_mem" in m for m in logs.messages)
    else:
        assert memory._runs == 2


def test_periodic_writer_rejects_non_writers():
    with pytest.raises(TypeError, match="EventWriter"):
        hooks.PeriodicWriter([object()])


def test_periodic_evaluation_due_every_period_but_not_after_the_last_step():
    due = [n for n in range(1, 13) if hooks.periodic_evaluation_due(n, 4, 12)]
    assert due == [4, 8]  # 12 is the last step: the final evaluation is after_train's
    assert not any(hooks.periodic_evaluation_due(n, 0, 12) for n in range(1, 13))  # 0: only the final one
