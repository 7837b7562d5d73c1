"""IterationTimer: warm-up (compilation) stays out of the step time, the ETA and the overall
speed; the device is synchronised only at the writers' period; the time of an asynchronous
step includes the device work it queued."""
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from reid_engine.engine import hooks
from reid_engine.engine.hooks import basic
from reid_engine.engine.train_loop import TrainerBase
from reid_engine.utils.events import CommonMetricPrinter

from ._engine_fixtures import capture_logs, one_torch_thread  # noqa: F401 (autouse fixture)


class FakeClock:
    """perf_counter for the timer: advances only when a step says so (a loaded machine
    cannot make a step of "about nothing" slow)."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


class SleepyTrainer(TrainerBase):
    """Steps that take ``slow`` seconds at the given iterations (flagged as warm-up where
    ``flag`` says so, as a compiling step does) and 1 ms otherwise, on ``clock`` when given."""

    def __init__(self, slow=(), flag=(), seconds=0.3, clock=None):
        super().__init__()
        self.slow, self.flag, self.seconds, self.clock = set(slow), set(flag), seconds, clock

    def run_step(self):
        seconds = self.seconds if self.iter in self.slow else 0.001
        if self.clock is not None:
            self.clock.now += seconds
        elif self.iter in self.slow:
            time.sleep(seconds)
        if self.iter in self.flag:
            self.warmup_step = True


def _timed(trainer):
    return {itr: v for v, itr in trainer.storage.history("time").values()}


def test_slow_warmup_steps_stay_out_of_time_eta_and_overall_speed(monkeypatch):
    # A 0.3 s first step (compilation) and a 0.3 s step flagged as warm-up later (a late
    # compilation), against steps of 1 ms.
    clock = FakeClock()
    monkeypatch.setattr(basic, "time", clock)
    trainer = SleepyTrainer(slow=(0, 7), flag=(7,), clock=clock)
    timer = hooks.IterationTimer(warmup_iter=3, sync_period=5)
    trainer.register_hooks([timer, hooks.PeriodicWriter([CommonMetricPrinter(15)], period=5)])
    with capture_logs() as logs:
        trainer.train(0, 15)
    times = _timed(trainer)
    assert sorted(times) == [3, 4, 5, 6] + list(range(8, 15))
    assert max(times.values()) == pytest.approx(0.001)
    eta_seconds = trainer.storage.history("eta_seconds").values()
    assert [itr for _, itr in eta_seconds] == [4, 9] and all(v < 0.5 for v, _ in eta_seconds)
    assert timer.total_time == pytest.approx(0.011)  # the late warm-up step is not in the totals either
    overall = [m for m in logs.messages if m.startswith("Overall training speed: 11 iterations in 0:00:00")]
    assert len(overall) == 1 and "excluding 4 warm-up iterations (start-up, compilation: 0.6 s)" in overall[0]
    assert any(m.startswith("Total training time: 0:00:00") for m in logs.messages)


def test_device_is_synchronised_only_at_warmup_first_timed_step_period_and_end(monkeypatch):
    calls = []
    trainer = SleepyTrainer()
    monkeypatch.setattr(basic, "synchronize_device", lambda device: calls.append(trainer.iter) or False)
    trainer.register_hooks([hooks.IterationTimer(warmup_iter=3, sync_period=20)])
    trainer.train(0, 45)
    assert calls == [0, 1, 2, 3, 19, 39, 44]
    assert len(_timed(trainer)) == 42  # on the CPU every timed step has its own time


def test_async_step_time_includes_the_queued_device_work(monkeypatch):
    # The steps only queue work; the "device" finishes it when synchronised (0.06 s).
    def synchronize(device):
        time.sleep(0.06)
        return True

    monkeypatch.setattr(basic, "synchronize_device", synchronize)
    trainer = SleepyTrainer()
    timer = hooks.IterationTimer(warmup_iter=0, sync_period=4)
    trainer.register_hooks([timer])
    with capture_logs() as logs:
        trainer.train(0, 8)
    times = _timed(trainer)
    assert times[0] >= 0.06  # the first timed step syncs alone
    for span in ([1, 2, 3], [4, 5, 6, 7]):
        values = [times[i] for i in span]
        assert len(set(values)) == 1 and sum(values) >= 0.06  # the span's mean, with the device work
    assert any(m.startswith("Overall training speed: 8 iterations") for m in logs.messages)


def test_a_failed_step_keeps_the_times_before_it():
    class Failing(SleepyTrainer):
        def run_step(self):
            if self.iter == 6:
                raise RuntimeError("boom")

    trainer = Failing()
    trainer.register_hooks([hooks.IterationTimer(warmup_iter=3, sync_period=20)])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train(0, 10)
    assert sorted(_timed(trainer)) == [3, 4, 5]


class ReportsCuda(nn.Module):
    """A model whose one "parameter" says it lives on cuda:0 (a stub: nothing is allocated)."""

    def parameters(self, recurse=True):
        yield SimpleNamespace(device=torch.device("cuda", 0))


def test_a_cuda_model_s_step_times_include_the_work_its_device_finished_at_synchronisation(monkeypatch):
    """The CUDA path on the CPU: the timer finds the model's CUDA device and synchronises it
    (torch.cuda.synchronize stands in: it "finishes" the queued 50 ms per step)."""
    clock = FakeClock()
    monkeypatch.setattr(basic, "time", clock)
    device = {"queued": 0.0, "synchronised": []}

    def synchronize(where=None):
        device["synchronised"].append(where)
        clock.now += device["queued"]
        device["queued"] = 0.0

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)

    class QueueingTrainer(TrainerBase):
        def __init__(self):
            super().__init__()
            self.model = ReportsCuda()

        def run_step(self):
            clock.now += 0.001  # the host only queues the work
            device["queued"] += 0.05

    trainer = QueueingTrainer()
    trainer.register_hooks([hooks.IterationTimer(warmup_iter=2, sync_period=5)])
    trainer.train(0, 12)
    times = _timed(trainer)
    assert sorted(times) == list(range(2, 12))
    assert sum(times.values()) == pytest.approx(10 * 0.051)  # all of it, and none of the warm-up steps' work
    assert times[3] == times[4] and times[5] == times[9]  # a span's mean (synchronised after steps 4 and 9)
    assert device["synchronised"] == [torch.device("cuda", 0)] * 6  # warm-up 0, 1; first timed 2; 4, 9; last 11


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (real queued kernels)")
def test_cuda_step_time_includes_its_gpu_work():
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)

    def queue_work():
        x = a
        for _ in range(8):
            x = (x @ a).tanh_()
        return x

    queue_work()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    queue_work()
    torch.cuda.synchronize(device)
    reference = time.perf_counter() - start  # tens of ms of GPU work; queueing it takes well under 1 ms

    class GpuTrainer(TrainerBase):
        def __init__(self):
            super().__init__()
            self.model = nn.Linear(2, 2).to(device)

        def run_step(self):
            queue_work()

    trainer = GpuTrainer()
    trainer.register_hooks([hooks.IterationTimer(warmup_iter=2, sync_period=5)])
    trainer.train(0, 12)
    times = list(_timed(trainer).values())
    assert len(times) == 10
    assert sum(times) / len(times) > 0.5 * reference
