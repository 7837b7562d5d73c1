"""launch(): in-process runs, real 2-process gloo jobs, two "machines", torchrun, failures."""
import atexit
import json
import os
import socket
import subprocess
import sys
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist

from reid_engine.engine.launch import launch
from reid_engine.reliability.rendezvous import default_dist_url, find_free_port
from reid_engine.runtime.compile import compile_model, uncompile_model
from reid_engine.utils import comm

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launch_job.py")
STEPS, LR, BATCH = 3, 0.1, 4
# Guard against hangs only: start-up of several torch processes on a busy 2-core
# machine can take a minute; the real time bounds are asserted separately.
JOB_TIMEOUT_S = 240


def _toy_model():
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def _toy_batch(rank):
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(BATCH, 3, generator=gen), torch.randn(BATCH, 1, generator=gen)


class _ToyNet(torch.nn.Module):
    """The toy model in a module of its own: torch.compile traces user modules, not torch.nn's."""

    def __init__(self):
        super().__init__()
        self.net = _toy_model()

    def forward(self, x):
        return self.net(x)


def _train(model, batches, after_step=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        if after_step is not None and step:
            after_step(step - 1)
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return model


def _thread_names(os=os):
    """The names of this process's threads (Linux). Only os.* (bound here): it runs in finalization too."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            fd = os.open(f"/proc/self/task/{tid}/comm", os.O_RDONLY)
        except OSError:  # a thread that just ended
            continue
        names.append(os.read(fd, 64).decode().strip())
        os.close(fd)
    return names


def _write_thread_names(path, os=os, json=json, names=_thread_names):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, json.dumps(names()).encode())
    os.close(fd)


def _touch_later(path):
    time.sleep(0.3)
    open(path, "w").close()


class _FinalizationProbe:
    """When freed by interpreter finalization, writes down the threads still running."""

    def __init__(self, path):
        self.path = path

    def __del__(self, write=_write_thread_names):  # bound now: module globals may be gone by then
        write(self.path)


_KEPT = []  # what a worker keeps to the end: its process group, as a DDP model does


def _watch_the_end(out_dir, rank):
    """Set up the checks of how the worker ends (see the DDP test)."""
    _KEPT.append(dist.group.WORLD)
    # The probe in a module that only sys.modules holds: finalization, if it comes, frees it.
    probe = types.ModuleType("_reid_engine_finalization_probe")
    probe.probe = _FinalizationProbe(os.path.join(out_dir, f"finalized{rank}.json"))
    sys.modules[probe.__name__] = probe
    atexit.register(_write_thread_names, os.path.join(out_dir, f"atexit{rank}.json"))
    threading.Thread(target=_touch_later, args=(os.path.join(out_dir, f"late{rank}"),)).start()  # not a daemon


def ddp_train_main(out_dir):
    """Worker: train the toy model with DDP on this rank's own batch, save weights and facts."""
    rank = comm.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(_toy_model())
    _train(model, [_toy_batch(rank)])
    # The same in place compiled (MODEL.COMPILE default, eager backend), then turned back to eager
    # after the first step as CompileGuard does (no collective: each worker alone).
    compiled = torch.nn.parallel.DistributedDataParallel(compile_model(_ToyNet(), "default", backend="eager"))
    _train(compiled, [_toy_batch(rank)], after_step=lambda step: uncompile_model(compiled) if step == 0 else None)
    torch.save(
        {
            "state": model.module.state_dict(),
            "compiled_state": compiled.module.state_dict(),
            "compiles": len(torch._dynamo.utils.get_compilation_metrics()),
            "world_size": comm.get_world_size(),
            "local_rank": comm.get_local_rank(),
            "local_size": comm.get_local_size(),
            "backend": dist.get_backend(),
        },
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    _watch_the_end(out_dir, rank)


def _record_pid_main(box):
    box.append((os.getpid(), dist.is_initialized(), comm.get_world_size()))


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _job(*args, **env):
    return subprocess.Popen(
        [sys.executable, JOB_SCRIPT, *map(str, args)],
        env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _finish(proc, timeout=None):
    out, _ = proc.communicate(timeout=timeout or JOB_TIMEOUT_S)
    assert proc.returncode == 0, out
    return out


def _read_ranks(out_dir, n):
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(n)]


def test_world_size_one_runs_in_this_process():
    box = []
    launch(_record_pid_main, 1, args=(box,))
    assert box == [(os.getpid(), False, 1)]


def test_argument_errors():
    with pytest.raises(ValueError, match="single|one machine|this machine only"):
        launch(_record_pid_main, 2, num_machines=2, dist_url="auto", args=([],))
    with pytest.raises(ValueError, match="machine_rank"):
        launch(_record_pid_main, 2, num_machines=2, machine_rank=2)
    with pytest.raises(ValueError, match="at least one worker"):
        launch(_record_pid_main, 0)
    with pytest.raises(TypeError, match="picklable"):
        launch(lambda: None, 2, dist_url="auto")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="need 2 visible GPUs"):
            launch(_record_pid_main, 2, dist_url="auto", backend="gpu", args=([],))
    with pytest.raises(ValueError, match="unknown backend"):
        launch(_record_pid_main, 2, dist_url="auto", backend="mpi-ish", args=([],))


def test_default_url_and_free_port():
    url = default_dist_url()
    port = int(url.rsplit(":", 1)[1])
    assert url.startswith("tcp://127.0.0.1:") and url == default_dist_url()
    assert 2**15 + 2**14 <= port < 2**16
    free = find_free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free))  # really free


def test_occupied_default_port_is_a_clear_error():
    port = int(default_dist_url().rsplit(":", 1)[1])
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
        except OSError:
            pass  # already taken by something else: the error must come all the same
        with pytest.raises(RuntimeError, match=f"port {port} .*in use.*--dist-url auto"):
            launch(_record_pid_main, 2, args=([],))


@pytest.mark.slow
def test_ddp_two_gloo_workers_end_with_equal_weights_eager_and_compiled(tmp_path):
    launch(ddp_train_main, 2, dist_url="auto", args=(str(tmp_path),), backend="gloo")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert [r["world_size"] for r in results] == [2, 2]
    assert [r["local_rank"] for r in results] == [0, 1]
    assert [r["local_size"] for r in results] == [2, 2]
    assert results[0]["backend"] == "gloo"
    # DDP averages gradients, so each step equals a step on both ranks' batches at once.
    reference = _toy_model()
    x, y = zip(_toy_batch(0), _toy_batch(1))
    _train(reference, [(torch.cat(x), torch.cat(y))])
    initial = _toy_model().state_dict()
    for key, ref in reference.state_dict().items():
        torch.testing.assert_close(results[0]["state"][key], results[1]["state"][key], rtol=0, atol=0)
        torch.testing.assert_close(results[0]["state"][key], ref)
        assert not torch.equal(ref, initial[key])
        for result in results:  # compiled for a step, then eager: the same DDP training
            torch.testing.assert_close(result["compiled_state"][f"net.{key}"], ref)
    assert all(r["compiles"] >= 1 for r in results)
    # The end of each worker (issue 37): its process group outlived the teardown (the atexit
    # handlers, which ran, still saw gloo's threads), and its non-daemon thread was waited for;
    # but the interpreter never finalized with those threads running: one of them still
    # releasing its last collective then must take the GIL, is ended by Python inside a C++
    # destructor and aborts the process (SIGABRT).
    for rank in range(2):
        at_exit = json.loads((tmp_path / f"atexit{rank}.json").read_text())
        assert any("gloo" in name for name in at_exit), at_exit
        assert (tmp_path / f"late{rank}").exists()
        finalized = tmp_path / f"finalized{rank}.json"
        running = json.loads(finalized.read_text()) if finalized.exists() else []
        assert not [name for name in running if "gloo" in name or "tcpstore" in name], running


@pytest.mark.slow
def test_jobs_in_separate_processes(tmp_path):
    """Two 'machines', a failing worker and a torchrun-style job, run side by side."""
    machines_dir, fail_dir, torchrun_dir = (tmp_path / n for n in ("machines", "fail", "torchrun"))
    for d in (machines_dir, fail_dir, torchrun_dir):
        d.mkdir()
    url = f"tcp://127.0.0.1:{find_free_port()}"
    master_port = find_free_port()
    jobs = [_job("fail", fail_dir)]
    try:
        jobs += [_job("machines", r, url, machines_dir) for r in range(2)]
        jobs += [
            _job("torchrun", torchrun_dir, RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, LOCAL_WORLD_SIZE=2,
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=master_port)
            for r in range(2)
        ]
        failing, machines, torchrun = jobs[0], jobs[1:3], jobs[3:]

        # A failing worker ends its job non-zero, with its traceback, in bounded time:
        # within 60 s of the failure (start-up time on a loaded machine is not counted).
        out, _ = failing.communicate(timeout=JOB_TIMEOUT_S)
        ended = time.time()
        assert failing.returncode != 0, out
        assert "ValueError: worker 1 failed on purpose" in out
        assert ended - float((fail_dir / "raised_at").read_text()) < 60
        sleeper = int((fail_dir / "pid0").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(sleeper, 0)  # the worker that was sleeping is gone too

        # Two machines of one worker each: global ranks from machine_rank, local groups of 1.
        for proc in machines:
            _finish(proc)
        infos = _read_ranks(machines_dir, 2)
        assert [(i["rank"], i["world_size"], i["local_rank"], i["local_size"]) for i in infos] == [
            (0, 2, 0, 1), (1, 2, 0, 1)]
        assert infos[0]["gathered"] == infos[1]["gathered"] == [0, 10]

        # torchrun: env:// rendezvous, main runs in the started process itself.
        for proc in torchrun:
            _finish(proc)
        infos = _read_ranks(torchrun_dir, 2)
        assert [(i["rank"], i["world_size"], i["local_rank"], i["local_size"]) for i in infos] == [
            (0, 2, 0, 2), (1, 2, 1, 2)]
        assert infos[1]["gathered"] == [0, 10]
        for r, info in enumerate(infos):
            assert info["pid"] == int((torchrun_dir / f"main{r}").read_text())
    finally:
        for proc in jobs:  # never leave jobs behind when an assertion failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
