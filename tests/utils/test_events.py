"""EventStorage, its checkpoint state, and the writers."""
import glob
import json
import logging
import os
import re
import threading

import pytest
import torch

from reid_engine.integrations.event_writers import JSONWriter, TensorboardXWriter
from reid_engine.utils.events import CommonMetricPrinter, EventStorage, get_event_storage
from reid_engine.utils.scalar_history import ScalarHistory


@pytest.fixture
def caplog_reid(caplog, monkeypatch):
    """caplog that also sees records when setup_logger disabled propagation."""
    monkeypatch.setattr(logging.getLogger("reid_engine"), "propagate", True)
    caplog.set_level(logging.INFO, logger="reid_engine")
    return caplog


def test_get_event_storage_outside_and_nested():
    with pytest.raises(RuntimeError, match="outside an EventStorage"):
        get_event_storage()
    with EventStorage() as outer:
        assert get_event_storage() is outer
        with EventStorage() as inner:
            assert get_event_storage() is inner
        assert get_event_storage() is outer
    with pytest.raises(RuntimeError):
        get_event_storage()


def test_scalars_latest_and_smoothing():
    storage = EventStorage(start_iter=0)
    for value in [1.0, 5.0, 2.0, 8.0, 3.0]:
        storage.put_scalar("loss", value)
        storage.put_scalar("lr", value * 10, smoothing_hint=False)
        storage.step()
    assert storage.iter == 5
    assert storage.latest()["loss"] == (3.0, 4)
    smoothed = storage.latest_with_smoothing_hint(window=3)
    assert smoothed["loss"] == (3.0, 4)  # median of [2, 8, 3]
    assert storage.latest_with_smoothing_hint(window=4)["loss"] == (4.0, 4)  # median of [5, 2, 8, 3]
    assert smoothed["lr"] == (30.0, 4)  # no smoothing hint: the raw latest value
    assert storage.smoothing_hints() == {"loss": True, "lr": False}
    assert [v for v, _ in storage.history("loss").values()] == [1.0, 5.0, 2.0, 8.0, 3.0]
    assert set(storage.histories()) == {"loss", "lr"}
    with pytest.raises(KeyError, match="nope"):
        storage.history("nope")
    with pytest.raises(ValueError, match="smoothing_hint"):
        storage.put_scalar("loss", 1.0, smoothing_hint=False)


def test_smoothing_window_counts_iterations_not_values():
    storage = EventStorage()
    for itr, value in [(0, 1.0), (2, 9.0), (4, 4.0), (6, 6.0)]:
        storage.iter = itr
        storage.put_scalar("acc", value)
    # window of 4 iterations ending at 6 covers iterations 3..6: values 4 and 6
    assert storage.latest_with_smoothing_hint(window=4)["acc"] == (5.0, 6)


def test_put_scalars_tensor_values_and_name_scope():
    storage = EventStorage(start_iter=7)
    storage.put_scalars(a=torch.tensor(1.5), b=2)
    with storage.name_scope("val"):
        storage.put_scalar("mAP", 0.5, smoothing_hint=False)
    storage.put_scalar("c", 3.0)
    latest = storage.latest()
    assert latest["a"] == (1.5, 7) and isinstance(latest["a"][0], float)
    assert latest["val/mAP"] == (0.5, 7)
    assert "c" in latest and "val/c" not in latest


def _fill(storage, start, stop):
    for itr in range(start, stop):
        storage.iter = itr
        storage.put_scalar("loss", float((itr * 7) % 11))
        storage.put_scalar("lr", 0.1 / (itr + 1), smoothing_hint=False)


def test_state_dict_round_trip_gives_uninterrupted_smoothing(tmp_path):
    reference = EventStorage()
    _fill(reference, 0, 40)

    first = EventStorage()
    _fill(first, 0, 25)
    path = tmp_path / "storage.pth"
    torch.save(first.state_dict(), path)
    state = torch.load(path, weights_only=True)

    resumed = EventStorage(start_iter=25)
    resumed.load_state_dict(state)
    assert resumed.iter == 25
    assert resumed.latest() == {}  # only what the resumed run writes is "new"
    _fill(resumed, 25, 40)
    for window in (5, 20):
        assert resumed.latest_with_smoothing_hint(window) == reference.latest_with_smoothing_hint(window)
    assert resumed.history("loss").global_avg() == pytest.approx(reference.history("loss").global_avg())
    assert resumed.history("loss").values() == reference.history("loss").values()


def test_state_dict_is_bounded():
    storage = EventStorage()
    for itr in range(1500):
        storage.iter = itr
        storage.put_scalar("loss", float(itr))
    state = storage.state_dict()["histories"]["loss"]
    assert len(state["values"]) == 1000 and state["values"][-1].item() == 1499.0
    assert state["count"] == 1500


def test_scalar_history_reads_like_fvcore_and_bounds_its_length():
    history = ScalarHistory(max_length=3)
    for value in [4.0, 1.0, 7.0, 2.0]:
        history.update(value)  # iteration defaults to the update count
    assert history.values() == [(1.0, 1), (7.0, 2), (2.0, 3)]  # the oldest dropped
    assert history.latest() == 2.0 and history.global_avg() == pytest.approx(3.5)  # all four count
    assert history.median(3) == 2.0 and history.avg(2) == pytest.approx(4.5)
    restored = ScalarHistory(max_length=2)
    restored.load_state_dict(history.state_dict(max_values=3))
    assert restored.values() == [(7.0, 2), (2.0, 3)] and restored.global_avg() == history.global_avg()


def _read_json_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_json_writer_writes_only_new_values_and_appends(tmp_path):
    path = str(tmp_path / "out" / "metrics.json")
    with EventStorage() as storage:
        writer = JSONWriter(path)
        storage.put_scalars(a=1.0, b=2.0)
        storage.step()
        storage.put_scalar("a", 3.0)
        writer.write()
        writer.write()  # nothing new: no line
        storage.step()
        storage.put_scalar("b", 4.0)
        writer.write()
        writer.close()
    lines = _read_json_lines(path)
    assert lines == [
        {"iteration": 0, "b": 2.0},  # a's latest value is at iteration 1
        {"iteration": 1, "a": 2.0},  # smoothed: median of [1, 3]
        {"iteration": 2, "b": 3.0},  # median of [2, 4]
    ]
    with EventStorage(start_iter=10) as storage:
        writer = JSONWriter(path)
        storage.put_scalar("c", 5.0)
        writer.write()
        writer.close()
    assert len(_read_json_lines(path)) == 4 and _read_json_lines(path)[-1] == {"iteration": 10, "c": 5.0}


def test_tensorboard_writer_lazy_scalars_images_histograms(tmp_path):
    log_dir = str(tmp_path / "tb")
    with EventStorage() as storage:
        writer = TensorboardXWriter(log_dir)
        writer.write()  # nothing to write: no event file yet
        assert not os.path.exists(log_dir) or not os.listdir(log_dir)
        storage.put_scalar("loss", 1.0)
        storage.put_image("img", torch.rand(3, 8, 8))
        storage.put_histogram("weights", torch.tensor([0.0, 1.0, 2.0, 3.0]), bins=4)
        hist = storage.histograms[0]
        assert hist["bucket_counts"] == [1.0, 1.0, 1.0, 1.0]
        assert hist["num"] == 4 and hist["sum"] == 6.0 and hist["sum_squares"] == 14.0
        assert hist["bucket_limits"] == [0.75, 1.5, 2.25, 3.0]
        writer.write()
        assert storage.images == [] and storage.histograms == []
        writer.close()
    files = glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
    assert len(files) == 1 and os.path.getsize(files[0]) > 0
    with pytest.raises(ValueError, match="CHW"):
        EventStorage().put_image("bad", torch.rand(8, 8))


LINE_RE = re.compile(
    r"^eta: \d+:\d\d:\d\d  iter: (\d+)  total_loss: [\d.e+-]+  loss_cls: [\d.e+-]+  "
    r"time: \d+\.\d{4}  data_time: \d+\.\d{4}  lr: [\d.e+-]+$"
)


def test_common_metric_printer_format_and_last_line(caplog_reid):
    printer = CommonMetricPrinter(max_iter=10, window_size=20)
    with EventStorage() as storage:
        for itr in range(10):
            storage.iter = itr
            storage.put_scalars(loss_cls=1.0, total_loss=2.0, time=0.5, data_time=0.01)
            storage.put_scalar("lr", 0.01, smoothing_hint=False)
            if itr in (4, 9):
                printer.write()
        storage.iter = 10
        printer.write()  # training completed: nothing more
    lines = [r.getMessage() for r in caplog_reid.records if r.name == "reid_engine.utils.events"]
    assert len(lines) == 2, lines
    assert all(LINE_RE.match(line) for line in lines), lines
    assert lines[0].startswith("eta: 0:00:02  iter: 4  total_loss: 2  loss_cls: 1")  # 0.5 s x 5 left
    assert lines[1].startswith("eta: 0:00:00  iter: 9")
    assert "max_mem" not in lines[0]  # CPU only


def _one_printed_line(printer, caplog_reid):
    with EventStorage() as storage:
        storage.iter = 3
        storage.put_scalars(total_loss=1.0, time=0.1, data_time=0.01)
        printer.write()
    return [r.getMessage() for r in caplog_reid.records if r.name == "reid_engine.utils.events"][-1]


def test_printer_shows_memory_for_the_training_device_not_the_machine(caplog_reid, monkeypatch):
    """A CPU run prints the same line whether or not the machine has CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "max_mem" not in _one_printed_line(CommonMetricPrinter(max_iter=10), caplog_reid)
    assert "max_mem" not in _one_printed_line(CommonMetricPrinter(max_iter=10, device="cpu"), caplog_reid)


def test_printer_shows_the_peak_memory_of_the_cuda_training_device(caplog_reid, monkeypatch):
    """The CUDA path on the CPU: the peak of the training device (not the current one), in MiB."""
    asked = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: asked.append(device) or 812 << 20)
    line = _one_printed_line(CommonMetricPrinter(max_iter=10, device="cuda:1"), caplog_reid)
    assert line.endswith("  max_mem: 812M") and asked == [torch.device("cuda", 1)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the real allocator's peak)")
def test_printer_shows_peak_cuda_memory_for_a_cuda_run(caplog_reid):
    keep = torch.empty(1 << 20, device="cuda")  # 4 MB
    line = _one_printed_line(CommonMetricPrinter(max_iter=10, device="cuda"), caplog_reid)
    assert re.search(r"  max_mem: \d+M$", line), line
    del keep


def test_each_thread_sees_its_own_storage():
    """Two trainers in two threads (bench_main_job.py) open storages that overlap in time."""
    entered, release = [threading.Event(), threading.Event()], threading.Event()
    seen, errors = {}, []

    def worker(index):
        try:
            with EventStorage(100 * index) as storage:
                entered[index].set()
                release.wait(timeout=30)
                seen[index] = get_event_storage() is storage
        except Exception as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    threads[0].start()
    entered[0].wait(timeout=30)
    threads[1].start()
    entered[1].wait(timeout=30)
    release.set()  # the first thread leaves its storage while the second's is open
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert seen == {0: True, 1: True}
    with pytest.raises(RuntimeError, match="outside an EventStorage"):
        get_event_storage()  # the main thread opened none
