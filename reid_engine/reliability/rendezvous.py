"""Joining a job: the rendezvous address, and a bounded join of torch.distributed; and leaving it
(:func:`end_worker`: a finished worker ends with status 0, never by a signal at exit).

With a ``tcp://`` URL every worker checks in under its rank in the rendezvous store before
the process group is built, so a wrong or unreachable address, or a machine that never
starts, ends in one :class:`RendezvousError` line that names the address and the ranks that
did not join (bounded by ``--dist-timeout``).
"""
import atexit
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import List, NoReturn, Optional
from urllib.parse import urlparse

import torch.distributed as dist

from reid_engine.utils.errors import ReidUserError

__all__ = ["RendezvousError", "default_dist_url", "find_free_port", "check_default_port_free", "rendezvous",
           "join_process_group", "end_worker"]

logger = logging.getLogger(__name__)


def find_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _user_id() -> int:
    getuid = getattr(os, "getuid", None)
    if getuid is not None:
        return int(getuid())
    import getpass
    import zlib

    return zlib.crc32(getpass.getuser().encode("utf-8"))


def default_dist_url() -> str:
    """The URL used when none is given: ``tcp://127.0.0.1:<port from the user id>``.

    The port is fixed per user (2**15 + 2**14 + uid % 2**14), so orphaned workers of
    an earlier run show up as an occupied port instead of silently joining a new job.
    """
    port = 2**15 + 2**14 + _user_id() % 2**14
    return f"tcp://127.0.0.1:{port}"


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def check_default_port_free(url: str) -> None:
    """Fail early, with the fix, when the per-user default port is taken."""
    port = _port_of(url)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise RuntimeError(
                f"port {port} of the default dist URL {url} is in use, probably by workers of an "
                f"earlier run that are still alive (see `lsof -i :{port}`); stop them, or pass "
                "--dist-url auto to use a free port"
            ) from None


class RendezvousError(ReidUserError, RuntimeError):
    """The workers of a job did not all join within --dist-timeout."""


def _rank_key(rank: int) -> str:
    return f"reid_engine/joined/{rank}"


def _missing_ranks(store: "dist.Store", world_size: int) -> List[int]:
    return [r for r in range(world_size) if not store.check([_rank_key(r)])]


def rendezvous(dist_url: str, world_size: int, rank: int, num_local_workers: int,
                timeout_s: float) -> Optional["dist.Store"]:
    """Join the job's store at a tcp:// URL and wait until every rank has checked in.

    Returns:
        the store to build the process group on (None for other URL schemes, e.g.
        file://: they join through init_process_group, bounded by the collective timeout).
    Raises:
        RendezvousError: the address cannot be reached or served, or ranks are missing
            after `timeout_s`; the message names the address and the missing ranks.
    """
    url = urlparse(dist_url)
    if url.scheme != "tcp" or not url.hostname or not url.port:
        return None
    deadline = time.monotonic() + timeout_s
    fix = "check --dist-url, --num-machines and --machine-rank on every machine, or raise --dist-timeout"
    # Python-side waiting (connect, then poll the keys) keeps torch's C++ retry logs off the console.
    if rank != 0 and not _wait_until_reachable(url.hostname, url.port, deadline):
        raise RendezvousError(f"rank {rank} could not reach the rendezvous at {dist_url} within {timeout_s:g} s: "
                              f"machine 0 is not running, or the address is wrong or blocked; {fix}")
    try:
        store = dist.TCPStore(url.hostname, url.port, world_size, is_master=rank == 0,
                              timeout=timedelta(seconds=max(timeout_s, 1.0)), wait_for_workers=False)
        store.set(_rank_key(rank), "1")
        keys = [_rank_key(r) for r in range(world_size)]
        while not store.check(keys):
            if time.monotonic() > deadline:
                missing = _missing_ranks(store, world_size)
                machines = sorted({r // num_local_workers for r in missing})
                raise RendezvousError(
                    f"the job did not form within {timeout_s:g} s at {dist_url}: rank(s) {', '.join(map(str, missing))} "
                    f"of {world_size} (machine(s) {', '.join(map(str, machines))}) never joined; {fix}")
            time.sleep(0.05)
    except (RuntimeError, OSError) as e:  # DistNetworkError / DistStoreError are RuntimeErrors
        if isinstance(e, RendezvousError):
            raise
        if rank == 0:
            raise RendezvousError(f"cannot serve the rendezvous at {dist_url} on this machine "
                                  f"({' '.join(str(e).split())[:160]}): the port is in use or the address is not this "
                                  "machine's; choose a free port or this machine's address (--dist-url)") from None
        raise RendezvousError(f"rank {rank} lost the rendezvous at {dist_url} before every rank joined (machine 0 gave "
                              f"up or stopped); {fix}") from None
    return store


def _wait_until_reachable(host: str, port: int, deadline: float) -> bool:
    """Try to open a TCP connection to host:port until `deadline` (time.monotonic())."""
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def join_process_group(backend: str, dist_url: str, world_size: int, rank: int, num_local_workers: int,
                        timeout: timedelta, rendezvous_timeout_s: float) -> None:
    """init_process_group after a bounded rendezvous (see `rendezvous`)."""
    store = rendezvous(dist_url, world_size, rank, num_local_workers, rendezvous_timeout_s)
    if store is not None:
        dist.init_process_group(backend=backend, store=store, world_size=world_size, rank=rank, timeout=timeout)
        return
    try:
        dist.init_process_group(backend=backend, init_method=dist_url, world_size=world_size, rank=rank,
                                timeout=timeout)
    except Exception:
        logger.error("Worker %d could not join the process group at %s", rank, dist_url)
        raise


def end_worker() -> NoReturn:
    """End a spawned worker that finished its work and tore down: status 0, no interpreter finalization.

    ``destroy_process_group`` stops gloo's threads only when nothing else refers to the group,
    and a DDP model does (so does any group user code keeps). The threads then live into
    interpreter finalization, where one that is still releasing a finished collective (a
    barrier keeps the collectives before it) drops the last reference to a tensor that owns
    a Python object, must take the GIL, and is ended by Python with pthread_exit inside a
    C++ destructor: std::terminate ("terminate called without an active exception"),
    SIGABRT. tools/benchmarks/stress_gloo_teardown.py counts these aborts.

    So the worker does here what a normal exit does while the interpreter is whole (join its
    non-daemon threads, run the atexit handlers: logging.shutdown, the log files,
    multiprocessing's finalizers; flush stdout and stderr), then ``os._exit(0)`` ends the
    threads that remain with the process.
    """
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream must not turn success into failure
            stream.flush()
    os._exit(0)
