"""Start a (multi-process, multi-machine) job: one worker process per GPU or CPU slot.

``launch(main, num_gpus_per_machine, ...)`` runs ``main(*args)`` in every worker after
setting up ``torch.distributed``. Worker failures never leave a job hanging:

- on one machine, the first worker that raises stops the job: the parent terminates
  the other workers (SIGTERM after a short grace period, then SIGKILL) and re-raises
  with the failing worker's traceback, so the command exits non-zero;
- across machines, the workers of the other machines notice the broken connections
  in their next collective and fail in turn; `timeout` (given to
  ``init_process_group``) bounds every collective, and is the backstop when a peer
  silently disappears;
- joining is bounded by `rendezvous_timeout`: with a ``tcp://`` URL every worker checks
  in under its rank in the rendezvous store, so a wrong or unreachable address, or a
  machine that never starts, ends in one :class:`RendezvousError` line that names the
  address and the ranks that did not join.

Signals: the launcher of spawned workers passes SIGTERM / SIGUSR1 / SIGINT on to its
workers through a shared flag (they save a checkpoint after their current step and stop;
a worker compiling or evaluating has its main thread signalled by its own watcher of the
flag, so that the main worker stops at once, see ``reliability.preemption``; a worker still
starting up is never signalled); a second signal stops them at once.

End: a spawned worker whose `main` returned waits for its peers (a barrier), tears the
process groups down and ends with status 0 without interpreter finalization (see
``reliability.rendezvous.end_worker``), so a worker that finished its work never dies of a signal at exit.
"""
import logging
import os
import pickle
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reid_engine.utils import comm

from ..reliability import preemption
from ..reliability.rendezvous import (
    RendezvousError,
    check_default_port_free,
    default_dist_url,
    end_worker,
    find_free_port,
    join_process_group,
)

__all__ = ["DEFAULT_TIMEOUT", "DEFAULT_RENDEZVOUS_TIMEOUT_S", "RendezvousError", "launch", "default_dist_url",
           "launched_by_torchelastic"]

logger = logging.getLogger(__name__)

# Collective timeout: long enough for a slow evaluation on one rank while the others
# wait in a barrier, short enough that a lost peer ends the job.
DEFAULT_TIMEOUT = timedelta(minutes=30)
#: seconds the workers of a job wait for each other to join (--dist-timeout)
DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0
# Seconds the other workers get to exit by themselves after one failed, before
# SIGTERM; then as long again before SIGKILL.
_SHUTDOWN_GRACE_S = 3.0
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_BACKEND_ALIASES = {"auto": "auto", "gloo": "gloo", "cpu": "gloo", "nccl": "nccl", "cuda": "nccl", "gpu": "nccl"}


def _resolve_backend(backend: str, num_local_workers: int) -> str:
    """Pick "nccl" or "gloo" from the caller's intent and the visible GPUs."""
    intent = _BACKEND_ALIASES.get(str(backend).lower())
    if intent is None:
        raise ValueError(f"unknown backend {backend!r}; use one of {sorted(_BACKEND_ALIASES)}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if intent == "nccl" and gpus < num_local_workers:
        raise RuntimeError(
            f"{num_local_workers} GPU workers per machine need {num_local_workers} visible GPUs, "
            f"found {gpus}; lower --num-gpus, or run on CPU with MODEL.DEVICE cpu"
        )
    if intent == "auto":
        if 0 < gpus < num_local_workers:
            logger.warning("%d workers per machine but %d GPUs: using gloo (CPU collectives)", num_local_workers, gpus)
        intent = "nccl" if gpus >= num_local_workers else "gloo"
    return intent


def _launched_by_torchrun() -> bool:
    return all(name in os.environ for name in _TORCHRUN_VARS)


def launched_by_torchelastic() -> bool:
    """Whether torchrun (torch.distributed.elastic) started this process, so it may be a restart."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "TORCHELASTIC_RESTART_COUNT" in os.environ


def _setup_groups(num_local_workers: int) -> None:
    """After init_process_group: per-machine group, object-collective group, barrier."""
    comm.create_local_process_group(num_local_workers)
    comm.object_collective_group()  # collective creation, done now by every rank
    comm.synchronize()


def _shutdown() -> None:
    """Wait for all ranks, then tear the process group down."""
    comm.synchronize()
    comm.destroy_process_group()


def _run_under_torchrun(main_func: Callable, args: Sequence[Any], backend: str, timeout: timedelta) -> None:
    """torchrun started this process: join via env:// and run `main` here."""
    world_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"RANK/WORLD_SIZE/LOCAL_RANK are set but {' and '.join(missing)} not: start the job "
            "with torchrun, or unset RANK to let launch() start the workers"
        )
    backend = _resolve_backend(backend, local_size)
    logger.info("Launched by torchrun: rank %d of %d (local rank %d), backend %s; "
                "--num-gpus/--num-machines/--dist-url are ignored", rank, world_size, local_rank, backend)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    # torchrun's agent keeps one store across restarts: without a per-attempt namespace the
    # restarted group's new_group() finds the dead workers' addresses and fails to connect.
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend=backend, store=dist.PrefixStore(f"reid_engine/attempt_{attempt}", store),
                            world_size=world_size, rank=rank, timeout=timeout)
    _setup_groups(local_size)
    main_func(*args)
    _shutdown()


def _distributed_worker(
    local_rank: int,
    main_func: Callable,
    world_size: int,
    num_local_workers: int,
    machine_rank: int,
    backend: str,
    dist_url: str,
    args: Sequence[Any],
    timeout: timedelta,
    rendezvous_timeout_s: float = DEFAULT_RENDEZVOUS_TIMEOUT_S,
    stop_flag: Any = None,
) -> None:
    """Body of one spawned worker: join the process group, run main, tear down."""
    global_rank = machine_rank * num_local_workers + local_rank
    preemption.set_external_stop_flag(stop_flag)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    join_process_group(backend, dist_url, world_size, global_rank, num_local_workers, timeout, rendezvous_timeout_s)
    _setup_groups(num_local_workers)
    # On failure we do not tear down: the parent terminates the peers, and a
    # destroy_process_group with peers mid-collective could block.
    main_func(*args)
    _shutdown()
    end_worker()


def _check_picklable(main_func: Callable, args: Sequence[Any]) -> None:
    try:
        pickle.dumps((main_func, tuple(args)))
    except Exception as e:
        raise TypeError(
            "launch: main_func and args must be picklable to start worker processes "
            f"(define main at module level, not as a lambda or nested function): {e}"
        ) from None


def launch(
    main_func: Callable,
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: Optional[str] = None,
    args: Sequence[Any] = (),
    timeout: timedelta = DEFAULT_TIMEOUT,
    backend: str = "auto",
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT_S,
) -> None:
    """Run ``main_func(*args)`` in every worker of a (possibly distributed) job.

    Args:
        main_func: the function to run; must be importable (module level) for
            multi-process runs.
        num_gpus_per_machine: workers on this machine (GPUs, or CPU processes with gloo).
        num_machines: machines in the job.
        machine_rank: this machine's index, in [0, num_machines).
        dist_url: rendezvous URL, e.g. ``tcp://host:port``; "auto" picks a free local
            port (single machine only); None uses `default_dist_url()`.
        args: positional arguments for `main_func`.
        timeout: `init_process_group` timeout: bounds every collective, so workers
            whose peers vanished (e.g. another machine's worker crashed) fail instead of
            hanging forever.
        backend: "auto" (NCCL when CUDA is available and there is a GPU per worker,
            else gloo), or the intent "cpu"/"gloo" or "gpu"/"cuda"/"nccl".
        rendezvous_timeout: seconds every worker waits for the others to join (see
            `RendezvousError`); not used under torchrun, whose rendezvous has its own.

    World size = num_machines * num_gpus_per_machine. World size 1 runs `main_func` in
    this process without a process group. When torchrun started this process (RANK,
    WORLD_SIZE and LOCAL_RANK set), the group is joined via ``env://`` and `main_func`
    runs here; nothing is spawned.

    Raises:
        ValueError: inconsistent sizes/ranks, or "auto" with several machines.
        torch.multiprocessing.ProcessRaisedException: a worker raised (its traceback is
            in the message; the other local workers have been stopped).
    """
    if _launched_by_torchrun() and not (dist.is_available() and dist.is_initialized()):
        _run_under_torchrun(main_func, args, backend, timeout)
        return
    if num_gpus_per_machine < 1 or num_machines < 1:
        raise ValueError(
            f"need at least one worker and one machine, got num_gpus_per_machine={num_gpus_per_machine}, "
            f"num_machines={num_machines}"
        )
    if not 0 <= machine_rank < num_machines:
        raise ValueError(f"machine_rank must be in [0, {num_machines}), got {machine_rank}")
    world_size = num_machines * num_gpus_per_machine
    if world_size == 1:
        main_func(*args)
        return

    if dist_url == "auto":
        if num_machines > 1:
            raise ValueError(
                'dist_url="auto" picks a port on this machine only; with several machines pass '
                "tcp://<address of machine 0>:<port> on every machine"
            )
        dist_url = f"tcp://127.0.0.1:{find_free_port()}"
    elif dist_url is None:
        dist_url = default_dist_url()
        if machine_rank == 0:
            check_default_port_free(dist_url)
    if num_machines > 1 and dist_url.startswith(("tcp://127.0.0.1", "tcp://localhost")):
        logger.warning("dist_url %s is local: all %d machines must be this host", dist_url, num_machines)

    backend = _resolve_backend(backend, num_gpus_per_machine)
    _check_picklable(main_func, args)
    logger.info("Launching %d workers on machine %d of %d (world size %d, %s, %s)",
                num_gpus_per_machine, machine_rank, num_machines, world_size, backend, dist_url)
    # A signal to this process alone (Kubernetes signals PID 1) reaches the workers through it.
    stop_flag = mp.get_context("spawn").Value("i", 0)
    context = mp.start_processes(
        _distributed_worker,
        nprocs=num_gpus_per_machine,
        args=(main_func, world_size, num_gpus_per_machine, machine_rank, backend, dist_url, tuple(args), timeout,
              float(rendezvous_timeout), stop_flag),
        start_method="spawn",
        join=False,
    )
    restore = preemption.launcher_stop_handlers(stop_flag, on_second=lambda: _kill_survivors(context, at_once=True))
    try:
        # join() returns False while workers run; on the first failure it stops the
        # others (grace period, SIGTERM, grace period, SIGKILL) and raises.
        while not context.join(grace_period=_SHUTDOWN_GRACE_S):
            pass
    except BaseException:
        _kill_survivors(context)
        raise
    finally:
        restore()


def _kill_survivors(context: Any, at_once: bool = False) -> None:
    """Make sure no worker outlives the parent's exception (e.g. Ctrl-C in the parent);
    `at_once`: SIGKILL without a grace period."""
    for process in context.processes:
        if process.is_alive() and at_once:
            process.kill()
        elif process.is_alive():
            process.terminate()
    for process in context.processes:
        process.join(_SHUTDOWN_GRACE_S)
        if process.is_alive():
            process.kill()
            process.join()
