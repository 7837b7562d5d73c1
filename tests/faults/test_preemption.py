"""Preemption: SIGTERM / SIGUSR1 / SIGINT finish the step, save a checkpoint, log the --resume command and
exit 143, also when the signal went to the whole process group (loader workers included); a second signal
stops at once; resuming is exact. (Every worker stopping after the same iteration when one is signalled:
tests/faults/test_resume_world_size.py, on real gloo workers.)"""
import os
import shlex
import signal
import subprocess
import sys

import pytest
import torch

from reid_engine.engine import hooks
from reid_engine.reliability import preemption
from reid_engine.utils.checkpoint import Checkpointer
from tests.conftest import REPO_ROOT
from tests.engine._engine_fixtures import make_trainer, one_torch_thread  # noqa: F401
from tests.faults._group_job import GroupJob
from tests.faults._jobs import assert_same_run, finish, job_args, job_env, read, start


def _trainer_with_preemption(out, period=100):
    trainer = make_trainer()
    checkpointer = Checkpointer(trainer.model, str(out), trainer=trainer)
    periodic = hooks.PeriodicCheckpointer(checkpointer, period)
    return trainer, checkpointer, periodic


def _signal_at(iteration, *signums):
    def before_step(trainer):
        if trainer.iter == iteration:
            for signum in signums:
                os.kill(os.getpid(), signum)
    return hooks.CallbackHook(before_step=before_step)


def test_signal_saves_its_step_restores_handlers_and_resumes_exactly(tmp_path):
    reference, _, _ = _trainer_with_preemption(tmp_path / "ref")
    reference.train(0, 8)

    previous = signal.getsignal(signal.SIGUSR1)
    trainer, checkpointer, periodic = _trainer_with_preemption(tmp_path / "run")
    trainer.register_hooks([_signal_at(3, signal.SIGUSR1, signal.SIGUSR1), periodic, hooks.Preemption(periodic)])
    with pytest.raises(preemption.TrainingPreempted) as info:
        trainer.train(0, 8)
    assert info.value.exit_code == preemption.PREEMPTED_EXIT_CODE == 143
    assert info.value.iteration == 3 and "SIGUSR1 after iteration 3" in str(info.value)
    assert signal.getsignal(signal.SIGUSR1) is previous  # handlers put back after training
    assert checkpointer.get_checkpoint_file() == str(tmp_path / "run" / "model_0000003.pth")

    resumed, checkpointer, periodic = _trainer_with_preemption(tmp_path / "run")
    checkpointer.resume_or_load("", resume=True)
    resumed.train(resumed.iter + 1, 8)
    for (name, a), b in zip(reference.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_sigint_is_a_stop_request_like_sigterm(tmp_path):
    # Ctrl-C in a terminal (the real process group, loader workers included: SIGTERM below).
    trainer, checkpointer, periodic = _trainer_with_preemption(tmp_path)
    trainer.register_hooks([_signal_at(2, signal.SIGINT), periodic, hooks.Preemption(periodic)])
    with pytest.raises(preemption.TrainingPreempted) as info:
        trainer.train(0, 8)
    assert info.value.signum == signal.SIGINT and "SIGINT after iteration 2" in str(info.value)
    assert checkpointer.get_checkpoint_file() == str(tmp_path / "model_0000002.pth")


def test_signal_in_the_last_step_lets_the_run_complete(tmp_path):
    trainer, checkpointer, periodic = _trainer_with_preemption(tmp_path)
    periodic.max_iter = 4
    trainer.register_hooks([_signal_at(3, signal.SIGTERM), periodic, hooks.Preemption(periodic)])
    trainer.train(0, 4)
    assert trainer.iter == 4 and os.path.basename(checkpointer.get_checkpoint_file()) == "model_final.pth"


SECOND_SIGNAL_SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from reid_engine.engine import hooks
from reid_engine.reliability import preemption
from reid_engine.utils.checkpoint import Checkpointer
from tests.engine._engine_fixtures import make_trainer
preemption.REPEAT_WINDOW_S = 0.2
def before_step(trainer):
    if trainer.iter == 2:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # the same request delivered twice: still one
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGUSR1)  # a second request: stop now
        time.sleep(30)
trainer = make_trainer()
periodic = hooks.PeriodicCheckpointer(Checkpointer(trainer.model, {out!r}, trainer=trainer), 2)
trainer.register_hooks([hooks.CallbackHook(before_step=before_step), periodic, hooks.Preemption(periodic)])
trainer.train(0, 10)
"""


@pytest.mark.slow
def test_second_signal_stops_at_once_and_keeps_the_last_checkpoint(tmp_path):
    script = SECOND_SIGNAL_SCRIPT.format(root=REPO_ROOT, out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], env=job_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGUSR1, proc.stderr[-3000:]
    assert read(tmp_path / "last_checkpoint").strip() == "model_0000001.pth"
    assert torch.load(tmp_path / "model_0000001.pth", weights_only=True)["iteration"] == 1
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_0000001.pth"]  # no partial file


@pytest.mark.slow
def test_sigterm_to_the_process_group_then_logged_resume_command_is_bit_identical(data_root, tmp_path):
    # A batch scheduler's cancel: SIGTERM to every process of the job, its 2 loader workers included.
    uninterrupted, out = str(tmp_path / "ref"), str(tmp_path / "out")
    workers = ("DATALOADER.NUM_WORKERS", "2")
    reference = start(job_args(data_root, uninterrupted, *workers))  # alongside: each run keeps one core busy
    job = GroupJob(out, job_args(data_root, out, *workers), signal.SIGTERM)
    job.signal_when_training()
    iteration, command = job.check_stopped_with_checkpoint(loader_workers=2)
    line = [ln for ln in read(os.path.join(out, "log.txt")).splitlines() if "training stopped by SIGTERM" in ln]
    assert len(line) == 1 and line[0].endswith(command), line

    resumed = subprocess.run([sys.executable] + shlex.split(command)[1:], env=job_env(), cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Starting training from iteration {iteration + 1}" in read(os.path.join(out, "log.txt"))
    rc, _, err = finish(reference)
    assert rc == 0, err[-3000:]
    assert_same_run(uninterrupted, out)


def test_a_signal_to_the_launcher_alone_reaches_the_workers_through_the_shared_flag():
    import multiprocessing as mp

    flag = mp.get_context("spawn").Value("i", 0)
    previous = signal.getsignal(signal.SIGTERM)
    restore = preemption.launcher_stop_handlers(flag, on_second=lambda: None)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.value == signal.SIGTERM
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is previous
    preemption.set_external_stop_flag(flag)  # what a spawned worker does
    try:
        assert preemption.requested_signal() == signal.SIGTERM
    finally:
        preemption.set_external_stop_flag(None)
    assert preemption.requested_signal() == 0
