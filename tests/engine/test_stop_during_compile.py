"""A stop signal during long work ends the run at once: a step that compiles (or records CUDA graphs) is
undone and the checkpoint of the last finished iteration saved; an evaluation is cut short, the checkpoint
of the evaluated iteration saved with the evaluation pending, and the resumed run evaluates first. Either
way the exit status is 143 with the resume line, and the resume is exact. A checkpoint save is never cut:
a signal during one stops right after it. Eager steps and steady compiled steps keep stopping after the
step, and pay nothing for it (no snapshot)."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from reid_engine.engine import hooks
from reid_engine.engine.hooks import CompileGuard
from reid_engine.engine.train_loop import SimpleTrainer
from reid_engine.reliability.preemption import PREEMPTED_EXIT_CODE, TrainingPreempted
from reid_engine.runtime import compile_guard
from reid_engine.utils.checkpoint import Checkpointer
from tests.conftest import REPO_ROOT
from tests.engine._engine_fixtures import ResumableStream, TinyModel, one_torch_thread  # noqa: F401
from tests.faults._jobs import error_lines, job_args, job_env, read, wait_for

#: the test's own target: from the signal to the end of the process
STOP_WITHIN_S = 10.0
STOP_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_stop_job.py")


# ---------------------------------------------------------------- in-process: the step's undo, the evaluation


class _DropoutModel(TinyModel):
    """TinyModel with dropout (draws from the global RNG) and callbacks in the middle of its forward and
    of its backward pass: where a test signals the step (the forward pass has changed the buffers and the
    RNG; in the backward pass, the step's losses are staged too)."""

    def __init__(self):
        super().__init__(num_losses=1)
        self.mid_forward = self.mid_backward = None

    def forward(self, batch):
        features = F.dropout(self.backbone(batch["x"]), 0.3, self.training)
        if self.mid_forward is not None:
            self.mid_forward()
        if self.mid_backward is not None:
            features.register_hook(lambda grad: self.mid_backward())
        return {"loss_cls": F.cross_entropy(self.head(features), batch["y"])}


class _NoisyAugment:
    """A batched augmentation with draws (global RNG) and a checkpointed step count."""

    def __init__(self):
        self.steps = 0

    def __call__(self, batch):
        self.steps += 1
        return {**batch, "x": batch["x"] + 0.01 * torch.randn_like(batch["x"])}

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = int(state["steps"])


class _LongSteps:
    """Stands for the CompileGuard of a compiled model that is warming up: every step may be long."""

    active = True
    warming_up = True

    def step_may_be_long(self):
        return True

    def run_step(self, step):
        step()


def _trainer(out, *extra_hooks, period=100, guard=None, cls=None):
    """A SimpleTrainer (or `cls`) over _DropoutModel with staged losses (written every 4 steps), an
    augmentation, a compile guard, checkpoints into `out` and the Preemption hook."""
    torch.manual_seed(0)
    model = _DropoutModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = (cls or SimpleTrainer)(model, ResumableStream(), optimizer, gather_metric_period=4,
                                     batch_augment=_NoisyAugment())
    trainer.compile_guard = _LongSteps() if guard is None else guard
    checkpointer = Checkpointer(model, str(out), trainer=trainer)
    periodic = hooks.PeriodicCheckpointer(checkpointer, period)
    trainer.register_hooks([*extra_hooks, periodic, hooks.Preemption(periodic)])
    return trainer, checkpointer


def _signal_at(trainer, iteration, where="mid_forward", signum=signal.SIGTERM):
    """Signal this process in the middle of step `iteration`; returns a list that gets the time it was sent."""
    sent = []

    def signal_now(*args):
        if trainer.iter == iteration:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signum)  # its handler runs here, in the middle of the step
    if where == "optimizer_step":
        trainer.optimizer.register_step_post_hook(signal_now)
    else:
        setattr(trainer.model, where, signal_now)
    return sent


def _report(what, sent):
    print(f"\n{what}: TrainingPreempted raised {time.monotonic() - sent[0]:.3f} s after the signal")


def test_a_stop_in_a_long_step_undoes_it_saves_the_previous_iteration_and_resumes_exactly(tmp_path):
    reference, _ = _trainer(tmp_path / "ref")
    reference.train(0, 8)
    reference_rng = torch.get_rng_state()

    previous = signal.getsignal(signal.SIGTERM)
    trainer, checkpointer = _trainer(tmp_path / "run")
    sent = _signal_at(trainer, 5, "mid_backward")  # after the BatchNorm update, the dropout draws, the staged loss
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(0, 8)
    _report("signal in a long step's backward pass", sent)
    assert info.value.exit_code == PREEMPTED_EXIT_CODE
    assert info.value.iteration == 4 and "SIGTERM after iteration 4" in str(info.value)
    assert checkpointer.get_checkpoint_file() == str(tmp_path / "run" / "model_0000004.pth")
    assert signal.getsignal(signal.SIGTERM) is previous
    state = torch.load(tmp_path / "run" / "model_0000004.pth", weights_only=True)["trainer"]
    # Step 5 had fetched and augmented its batch: neither counts in the checkpoint of iteration 4.
    assert state["iteration"] == 4 and state["data_loader"] == {"position": 5} and state["batch_augment"] == {"steps": 5}
    # The losses staged since the last write (iteration 4's) are written; step 5's is gone.
    assert [it for _, it in trainer.storage.history("total_loss").values()] == [0, 1, 2, 3, 4]

    resumed, checkpointer = _trainer(tmp_path / "run")
    checkpointer.resume_or_load("", resume=True)
    resumed.train(resumed.iter + 1, 8)
    # BatchNorm statistics, RNG draws (dropout, augmentation), data stream: as if never interrupted.
    for (name, a), b in zip(reference.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(torch.get_rng_state(), reference_rng)


def test_a_stop_in_a_new_run_s_first_step_saves_its_starting_state(tmp_path):
    trainer, checkpointer = _trainer(tmp_path)
    sent = _signal_at(trainer, 0, signum=signal.SIGUSR1)
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(0, 8)
    _report("signal in a new run's first step", sent)
    assert info.value.iteration == -1 and "SIGUSR1 before its first iteration finished" in str(info.value)
    assert checkpointer.get_checkpoint_file() == str(tmp_path / "model_start.pth")
    resumed, checkpointer = _trainer(tmp_path)
    checkpointer.resume_or_load("", resume=True)
    assert resumed.iter + 1 == 0


def test_a_signal_in_the_optimizer_step_of_a_long_step_lets_the_step_finish(tmp_path):
    trainer, checkpointer = _trainer(tmp_path)
    _signal_at(trainer, 3, "optimizer_step")  # the weights are changing: no undo from here on
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(0, 8)
    assert info.value.iteration == 3 and checkpointer.get_checkpoint_file() == str(tmp_path / "model_0000003.pth")


class _OwnTrainOnBatch(SimpleTrainer):
    """A user's trainer with its own train_on_batch: forward, backward, optimizer step, and nothing
    of preemption (no call ends an interruptible region)."""

    def train_on_batch(self, data, data_time):
        loss = self.model(data)["loss_cls"]
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()


class _OwnRunStep(SimpleTrainer):
    """A user's trainer with its own run_step (its own stream iterator, no compile guard call)."""

    def run_step(self):
        if getattr(self, "_own_stream", None) is None:
            self._own_stream = iter(self.data_loader)
        data = self.batch_augment(next(self._own_stream))
        _OwnTrainOnBatch.train_on_batch(self, data, 0.0)


@pytest.mark.parametrize("cls", [_OwnTrainOnBatch, _OwnRunStep], ids=["train_on_batch", "run_step"])
def test_a_user_s_own_step_keeps_its_stop_safety(tmp_path, cls):
    """Overriding train_on_batch or run_step keeps both halves of the guarantee: a signal before the
    optimizer step undoes the long step and resumes exactly; one in the optimizer step lets it finish."""
    reference, _ = _trainer(tmp_path / "ref", cls=cls)
    reference.train(0, 8)
    trainer, checkpointer = _trainer(tmp_path / "run", cls=cls)
    _signal_at(trainer, 5, "mid_backward")
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(0, 8)
    assert info.value.iteration == 4 and checkpointer.get_checkpoint_file() == str(tmp_path / "run" / "model_0000004.pth")
    resumed, checkpointer = _trainer(tmp_path / "run", cls=cls)
    checkpointer.resume_or_load("", resume=True)
    resumed.train(resumed.iter + 1, 8)
    for (name, a), b in zip(reference.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name

    finishing, checkpointer = _trainer(tmp_path / "finish", cls=cls)
    _signal_at(finishing, 3, "optimizer_step")  # the weights are changing: no undo from here on
    with pytest.raises(TrainingPreempted) as info:
        finishing.train(0, 8)
    assert info.value.iteration == 3 and checkpointer.get_checkpoint_file() == str(tmp_path / "finish" / "model_0000003.pth")


def _count_snapshots(trainer):
    """Record the iterations at which `trainer` takes a step snapshot (its public step_snapshot)."""
    taken, take = [], trainer.step_snapshot

    def counted():
        taken.append(trainer.iter)
        return take()
    trainer.step_snapshot = counted
    return taken


class _SteadyGuard(CompileGuard):
    """A real CompileGuard whose model runs compiled and past its warm-up: its rule of long steps is real."""

    active = True
    warming_up = False

    def run_step(self, step):
        step()


def test_eager_and_steady_compiled_steps_take_no_snapshot_and_a_stop_waits_for_the_step(tmp_path, monkeypatch):
    compiles = {"count": 7}
    monkeypatch.setattr(compile_guard, "compile_count", lambda: compiles["count"])
    trainer, _ = _trainer(tmp_path)
    trainer.compile_guard = _SteadyGuard(trainer.model, "default", explicit=False)
    taken = _count_snapshots(trainer)

    def mid_forward():
        if trainer.iter == 3:
            compiles["count"] += 2  # a guard failed: this step compiles, the next may record CUDA graphs
        if trainer.iter == 6:
            os.kill(os.getpid(), signal.SIGTERM)
    trainer.model.mid_forward = mid_forward
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(0, 10)
    # The first compiled step of the process, and the one after a compilation: the others are steady.
    assert taken == [0, 4]
    assert info.value.iteration == 6  # a steady step is not interrupted: the stop comes after it

    eager, _ = _trainer(tmp_path / "eager")
    eager.compile_guard = None
    taken = _count_snapshots(eager)
    eager.train(0, 5)
    assert taken == []


def test_a_signal_during_a_checkpoint_save_lets_it_finish_and_stops_right_after(tmp_path):
    class _SignalWhileSaved:
        """A checkpointed object whose state is read in the middle of the save."""

        def state_dict(self):
            os.kill(os.getpid(), signal.SIGTERM)
            return {"read": 1}

        def load_state_dict(self, state):
            pass

    trainer, checkpointer = _trainer(tmp_path, period=3)
    checkpointer.add_checkpointable("signaller", _SignalWhileSaved())
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(0, 8)
    # The periodic save after iteration 2 completed (every step is interruptible here, saves never).
    assert info.value.iteration == 2 and info.value.checkpoint == str(tmp_path / "model_0000002.pth")
    saved = torch.load(tmp_path / "model_0000002.pth", weights_only=True)
    assert saved["trainer"]["iteration"] == 2 and saved["signaller"] == {"read": 1}
    assert read(tmp_path / "last_checkpoint").strip() == "model_0000002.pth"


def _interrupted_evaluation(results, stop_at_call):
    """An evaluation function returning next(results), that signals itself during its call number
    `stop_at_call` (from 1) and then waits, as a long evaluation would."""
    calls = []

    def evaluate():
        calls.append(time.monotonic())
        if len(calls) == stop_at_call:
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)
            raise AssertionError("the stop signal did not interrupt the evaluation")
        return {"val": {"metric": next(results)}}
    return evaluate, calls


def test_a_stop_in_a_periodic_evaluation_saves_it_pending_and_the_resumed_run_evaluates_first(tmp_path):
    evaluate, calls = _interrupted_evaluation(iter([1.0]), stop_at_call=2)
    trainer, checkpointer = _trainer(tmp_path, hooks.EvalHook(3, evaluate))
    trainer.register_hooks([hooks.BestCheckpointer(3, checkpointer, "val/metric")])
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(0, 9)
    _report("signal in a periodic evaluation", calls[-1:])
    assert info.value.iteration == 5 and len(calls) == 2  # the evaluation of iteration 5 was cut short
    saved = torch.load(tmp_path / "model_0000005.pth", weights_only=True)["trainer"]
    assert saved["hooks"]["EvalHook"] == {"pending": 5}
    assert saved["hooks"]["BestCheckpointer"] == {"best_metric": 1.0, "best_iter": 2}

    evaluate, calls = _interrupted_evaluation(iter([3.0, 2.0]), stop_at_call=0)
    eval_hook = hooks.EvalHook(3, evaluate)
    resumed, checkpointer = _trainer(tmp_path, eval_hook)
    best = hooks.BestCheckpointer(3, checkpointer, "val/metric")
    resumed.register_hooks([best])
    checkpointer.resume_or_load("", resume=True)
    resumed.train(resumed.iter + 1, 9)
    # Iteration 5's evaluation ran first, its value at iteration 5, and made the best checkpoint; then the
    # final one (iteration 8 is the last: no periodic evaluation).
    assert len(calls) == 2 and eval_hook.pending is None
    assert [it for _, it in resumed.storage.history("val/metric").values()] == [2, 5, 9]
    assert (best.best_metric, best.best_iter) == (3.0, 5)
    assert torch.load(tmp_path / "model_best.pth", weights_only=True)["iteration"] == 5


def test_a_stop_in_the_final_evaluation_saves_model_final_with_it_pending_after_every_after_train(tmp_path):
    ended = []
    evaluate, calls = _interrupted_evaluation(iter([]), stop_at_call=1)
    trainer, checkpointer = _trainer(tmp_path, hooks.EvalHook(0, evaluate),
                                     hooks.CallbackHook(after_train=lambda t: ended.append(t.iter)))
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(0, 6)
    _report("signal in the final evaluation", calls)
    assert info.value.iteration == 5 and info.value.checkpoint == str(tmp_path / "model_final.pth")
    assert ended == [5]  # the hooks after the evaluation still ended their training
    assert signal.getsignal(signal.SIGTERM) is previous
    saved = torch.load(tmp_path / "model_final.pth", weights_only=True)["trainer"]
    assert saved["iteration"] == 5 and saved["hooks"]["EvalHook"] == {"pending": 5}

    # The resumed run has no step left: it runs only the hooks of a completed run (DefaultTrainer.train
    # does this when the final evaluation is pending), and the evaluation is done at iteration 5.
    evaluate, calls = _interrupted_evaluation(iter([4.0]), stop_at_call=0)
    eval_hook = hooks.EvalHook(0, evaluate)
    resumed, checkpointer = _trainer(tmp_path, eval_hook)
    checkpointer.resume_or_load("", resume=True)
    assert eval_hook.pending == 5 and resumed.iter == 5
    with pytest.raises(ValueError, match="nothing to train"):
        resumed.train(6, 6)
    resumed.train(6, 6, hooks_only=True)
    assert len(calls) == 1 and eval_hook.pending is None
    assert [value for value, _ in resumed.storage.history("val/metric").values()] == [4.0]


# ---------------------------------------------------------------- real processes: the command line


def _start(args, out, **env):
    """`_stop_job.py args` in the background, its output in files under `out`."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "stdout.txt"), "w") as stdout, open(os.path.join(out, "stderr.txt"), "w") as stderr:
        return subprocess.Popen([sys.executable, STOP_JOB] + list(args), env=job_env(**env), cwd=REPO_ROOT,
                                stdout=stdout, stderr=stderr)


def _signal_when(proc, mark, signum=signal.SIGTERM, what="the marked work"):
    """Send `signum` to `proc` once the file `mark` exists and wait for its end; returns the time of the
    signal (time.time()) and the seconds from the signal to the end."""
    wait_for(lambda: os.path.exists(mark) or proc.poll() is not None, timeout=240, what=what)
    assert proc.poll() is None, "the job ended before it was signalled"
    sent, start = time.time(), time.monotonic()
    proc.send_signal(signum)
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return sent, time.monotonic() - start


def _check_stopped(out, proc, signalled, iteration, checkpoint, what):
    """Exit 143 within STOP_WITHIN_S of the signal, one error line naming the checkpoint and the --resume
    line; `signalled`: what _signal_when returned."""
    sent, seconds = signalled
    path = os.path.join(out, checkpoint)
    saved = os.path.getmtime(path) - sent if os.path.exists(path) else float("nan")
    print(f"\n{what}: checkpoint saved {saved:.2f} s and the run ended {seconds:.2f} s after the signal")
    err = read(os.path.join(out, "stderr.txt"))
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    assert seconds < STOP_WITHIN_S, f"{what}: the run ended {seconds:.1f} s after the signal"
    assert "Traceback" not in err and len(error_lines(err)) == 1, err[-3000:]
    line = error_lines(err)[0]
    where = "before its first iteration finished" if iteration < 0 else f"after iteration {iteration}"
    assert f"training stopped by SIGTERM {where}: checkpoint {path}" in line, line
    assert "--resume" in line.split("continue with", 1)[1]
    assert read(os.path.join(out, "last_checkpoint")).strip() == checkpoint
    assert torch.load(path, weights_only=True)["trainer"]["iteration"] == iteration


@pytest.mark.slow
def test_sigterm_while_inductor_compiles_the_first_step_stops_at_once(data_root, tmp_path, monkeypatch):
    # MODEL.COMPILE default: an explicit mode, inductor with its caches off, so that it lowers its graphs
    # for real, which is what the signal interrupts. It stops before its first step ends: its checkpoint is
    # the starting state. (Resuming from that state: test_a_stop_in_a_new_run_s_first_step_saves_its_starting_
    # state, in-process; a real SIGTERM's bit-identical resume: tests/faults/test_preemption.py.)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # inherited by the job
    out, mark = str(tmp_path / "out"), str(tmp_path / "lowering")
    job = _start(job_args(data_root, out, "MODEL.COMPILE", "default"), out, REID_TEST_COMPILE_MARK=mark,
                 TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    signalled = _signal_when(job, mark, what="inductor to lower a graph of the first step")
    _check_stopped(out, job, signalled, -1, "model_start.pth", "SIGTERM while compiling")
    assert "SIGTERM interrupted the training step: stopping with the checkpoint of the start" in read(
        os.path.join(out, "log.txt"))


EVALUATED = ("DATASETS.TESTS", "('SyntheticReIDTiny',)", "TEST.EVAL_PERIOD", "1")  # after iterations 8 and 17
# A stop in an evaluation, its pending checkpoint and the resumed run's evaluation first are proven in-process
# above; the real process stopped in an evaluation is the 2-worker launcher's below, and a real SIGTERM's
# bit-identical resume is tests/faults/test_preemption.py's.


@pytest.mark.slow
def test_sigterm_to_the_launcher_alone_stops_two_workers_evaluating_at_once(data_root, tmp_path):
    # Kubernetes signals PID 1 only: the launcher's flag reaches the workers in their evaluation; the main
    # worker saves alone (no collective) and the launcher ends the other one.
    out = str(tmp_path / "out")
    mark = str(tmp_path / "evaluating")
    job = _start(["--num-gpus", "2", "--dist-url", "auto"] + job_args(data_root, out, *EVALUATED), out,
                 REID_TEST_SLOW_EVAL=mark)
    signalled = _signal_when(job, mark, what="the first evaluation")
    _check_stopped(out, job, signalled, 8, "model_0000008.pth", "SIGTERM to the launcher of 2 workers evaluating")
    assert torch.load(os.path.join(out, "model_0000008.pth"), weights_only=True)["trainer"]["hooks"]["EvalHook"] == {
        "pending": 8}
