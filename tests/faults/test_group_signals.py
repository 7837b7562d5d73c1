"""A stop signal to the whole process group (a batch scheduler's cancel, Ctrl-C in a terminal) reaches the
data-loader workers too: the batches left are loaded in the main process (below) and the run saves a
checkpoint at the stop (the real process group, with the resume: test_preemption; two DDP workers agreeing
on the stop step: test_resume_world_size); a hook whose own loader dies of it stops without a new
checkpoint. A user error raised inside the loop (a re-clustering) is logged in one line without a traceback,
as at start-up; a bug keeps its traceback."""
import logging
import os
import signal
import subprocess

import pytest
import torch

from reid_engine.data import DevicePrefetcher, build_reid_train_loader
from reid_engine.engine import hooks
from reid_engine.engine.hooks.pseudo_labels import PseudoLabelError
from reid_engine.reliability import loader_faults
from reid_engine.reliability.preemption import PREEMPTED_EXIT_CODE, TrainingPreempted
from reid_engine.utils.checkpoint import Checkpointer
from reid_engine.utils.errors import ReidUserError
from tests.engine._engine_fixtures import make_trainer, one_torch_thread, tiny_trainer_cfg  # noqa: F401
from tests.engine.test_label_free import tiny_cfg as tiny_label_free_cfg
from tests.engine.test_label_free import train as train_label_free


class _Records(logging.Handler):
    """Keeps the records of the package's loggers at WARNING and above."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.slow
def test_unusable_pseudo_labels_end_the_run_in_one_line(data_root, tmp_path):
    # The re-clustering at iteration 0 finds no usable cluster: a PseudoLabelError (a ReidUserError).
    handler = _Records()
    logging.getLogger("reid_engine").addHandler(handler)
    try:
        with pytest.raises(PseudoLabelError, match="every target image is an outlier") as info:
            train_label_free(tiny_label_free_cfg(data_root, tmp_path, "SOLVER.MAX_EPOCH", 1, "PSEUDO.MIN_SAMPLES", 100000))
    finally:
        logging.getLogger("reid_engine").removeHandler(handler)
    assert "\n" not in str(info.value) and "raise PSEUDO.EPS (now " in str(info.value)
    (record,) = [r for r in handler.records if r.levelno >= logging.ERROR]
    assert record.getMessage() == f"Training stopped at iteration 0: {info.value}"
    assert record.exc_info is None  # the console and log.txt show no traceback, as at start-up


@pytest.mark.parametrize("error, traced", [(ReidUserError("bad value (SOME.KEY): set it to 1"), False),
                                           (ValueError("a bug"), True)], ids=["user error", "bug"])
def test_the_loop_logs_a_user_error_in_one_line_and_a_bug_with_its_traceback(caplog, error, traced):
    def fail_at_1(trainer):
        if trainer.iter == 1:
            raise error

    trainer = make_trainer()
    trainer.register_hooks([hooks.CallbackHook(after_step=fail_at_1)])
    with caplog.at_level(logging.INFO, logger="reid_engine"), pytest.raises(type(error)) as info:
        trainer.train(0, 3)
    assert info.value is error  # raised as it is, for the command line's one error line
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (record.exc_info is not None) == traced
    if not traced:
        assert record.getMessage() == "Training stopped at iteration 1: bad value (SOME.KEY): set it to 1"


class _Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, index):
        return torch.tensor(index)


def _children():
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
        return set(f.read().split())


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"), reason="needs Linux /proc")
def test_a_hook_whose_loader_workers_die_of_the_stop_signal_stops_without_a_new_checkpoint(tmp_path):
    def read_with_workers(trainer):  # a hook with a loader of its own (an evaluation, a re-clustering)
        if trainer.iter != 2:
            return
        before = _children()
        batches = iter(torch.utils.data.DataLoader(_Numbers(), batch_size=4, num_workers=1))
        next(batches)
        workers = _children() - before
        assert len(workers) == 1, workers
        # A signal to the group, sent from outside (a worker ends itself quietly on its parent's SIGTERM).
        subprocess.run(["kill", "-TERM", str(os.getpid()), *workers], check=True)
        try:
            for _ in batches:
                pass
        finally:  # reap the dead worker now: torch's SIGCHLD handler would report it in a later test
            batches._shutdown_workers()

    trainer = make_trainer()
    periodic = hooks.PeriodicCheckpointer(Checkpointer(trainer.model, str(tmp_path), trainer=trainer), 100)
    trainer.register_hooks([hooks.CallbackHook(after_step=read_with_workers), periodic, hooks.Preemption(periodic)])
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(0, 5)
    assert info.value.exit_code == PREEMPTED_EXIT_CODE and info.value.signum == signal.SIGTERM
    assert info.value.iteration == 2 and info.value.checkpoint == ""
    assert "during iteration 2" in str(info.value) and "continue from the last one in OUTPUT_DIR" in str(info.value)
    assert os.listdir(tmp_path) == []  # nothing saved mid-hook


class _Steps:
    """The part of a step trainer that load_in_main_process uses: its loader and a restartable stream."""

    def __init__(self, data_loader):
        self.data_loader = data_loader
        self.restart_data_stream()

    def restart_data_stream(self):
        self.stream = iter(self.data_loader)


@pytest.mark.parametrize("prefetch", [False, True], ids=["loader", "prefetcher"])
def test_loading_the_batches_left_in_the_main_process_continues_the_stream_exactly(data_root, tmp_path, prefetch):
    def loader(workers):
        return build_reid_train_loader(tiny_trainer_cfg(data_root, tmp_path, "DATALOADER.NUM_WORKERS", workers))

    reference = iter(loader(0))
    expected = [next(reference)["images"] for _ in range(5)]
    train_loader = loader(1)
    # A device prefetcher (CUDA training) holds a batch ahead: the stream must not skip it.
    steps = _Steps(DevicePrefetcher(train_loader, "cpu") if prefetch else train_loader)
    for batch in expected[:3]:
        assert torch.equal(next(steps.stream)["images"], batch)  # from the worker, which has read ahead
    assert loader_faults.load_in_main_process(steps)
    assert train_loader.num_workers == 0
    for batch in expected[3:]:
        assert torch.equal(next(steps.stream)["images"], batch)
