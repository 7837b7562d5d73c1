"""Helpers for multi-process (torch.distributed) runs.

Every function answers sensibly when no process group exists (a plain single-process
run): world size 1, rank 0, collectives return the local value.
"""
import functools
import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "get_world_size",
    "get_rank",
    "get_local_rank",
    "get_local_size",
    "is_main_process",
    "synchronize",
    "all_gather",
    "gather",
    "shared_random_seed",
    "reduce_dict",
    "create_local_process_group",
    "object_collective_group",
    "destroy_process_group",
    "unwrap_model",
]

# Group of the workers on this machine; set by `create_local_process_group`, which
# `reid_engine.engine.launch` calls in every worker.
_LOCAL_PROCESS_GROUP: Optional["dist.ProcessGroup"] = None


def _is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    """Return the number of processes in the job (1 without a process group)."""
    return dist.get_world_size() if _is_distributed() else 1


def get_rank() -> int:
    """Return this process's global rank (0 without a process group)."""
    return dist.get_rank() if _is_distributed() else 0


def _on_this_machine(query: Callable[..., int], env_var: str, single_process: int) -> int:
    """Ask `query` (``dist.get_rank`` or ``dist.get_world_size``) about this machine's workers.

    The local process group made by `launch` answers; without one (a process group
    initialised by the user) the environment variable `env_var` set by torchrun, then the
    global answer. `single_process` without a process group.
    """
    if not _is_distributed():
        return single_process
    if _LOCAL_PROCESS_GROUP is not None:
        return query(group=_LOCAL_PROCESS_GROUP)
    return int(os.environ.get(env_var, query()))


def get_local_rank() -> int:
    """Return this process's rank among the workers of its machine.

    Uses the local process group made by `launch`; without one (a process group
    initialised by the user) falls back to `LOCAL_RANK` from the environment, then to
    the global rank. 0 without a process group.
    """
    return _on_this_machine(dist.get_rank, "LOCAL_RANK", 0)


def get_local_size() -> int:
    """Return the number of workers on this machine (1 without a process group).

    Falls back like `get_local_rank`: `LOCAL_WORLD_SIZE`, then the world size.
    """
    return _on_this_machine(dist.get_world_size, "LOCAL_WORLD_SIZE", 1)


def is_main_process() -> bool:
    """Return True on global rank 0 (always True without a process group)."""
    return get_rank() == 0


def synchronize() -> None:
    """Block until every process reaches this call; a no-op for world size 1."""
    if get_world_size() == 1:
        return
    if dist.get_backend() == dist.Backend.NCCL and torch.cuda.is_available():
        # Naming the device avoids NCCL guessing it (and warning) from the rank.
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def create_local_process_group(num_workers_per_machine: int) -> None:
    """Create the per-machine process group; every rank of the job must call this.

    Machine m holds global ranks ``[m * n, (m + 1) * n)`` (the layout `launch` uses).

    Args:
        num_workers_per_machine: n, the number of workers on each machine.
    """
    global _LOCAL_PROCESS_GROUP
    if not _is_distributed():
        raise RuntimeError(
            "create_local_process_group needs an initialised process group; "
            "call torch.distributed.init_process_group first (launch does this)"
        )
    world_size = dist.get_world_size()
    if num_workers_per_machine < 1 or world_size % num_workers_per_machine != 0:
        raise ValueError(
            f"world size {world_size} is not a multiple of {num_workers_per_machine} "
            "workers per machine; every machine must run the same number of workers"
        )
    machine_rank = dist.get_rank() // num_workers_per_machine
    for machine in range(world_size // num_workers_per_machine):
        ranks = list(range(machine * num_workers_per_machine, (machine + 1) * num_workers_per_machine))
        group = dist.new_group(ranks)  # collective: all ranks create every group
        if machine == machine_rank:
            _LOCAL_PROCESS_GROUP = group


@functools.lru_cache()
def object_collective_group() -> "dist.ProcessGroup":
    """Return the group used for pickled-object collectives.

    NCCL can only move CUDA tensors, so with an NCCL default group a gloo group over
    all ranks is created (once, collectively) and used instead. `launch` creates it
    right after initialisation so that first use is never a surprise collective.
    """
    if dist.get_backend() == dist.Backend.NCCL:
        return dist.new_group(backend="gloo")
    return dist.group.WORLD


def destroy_process_group() -> None:
    """Tear down torch.distributed and forget the groups created here (no-op without one).

    A group that something else still refers to (a DDP model does) keeps its gloo threads
    running after this; `launch`'s workers therefore end without interpreter finalization
    (issue 37: such a thread can abort the process there).
    """
    global _LOCAL_PROCESS_GROUP
    _LOCAL_PROCESS_GROUP = None
    object_collective_group.cache_clear()
    if _is_distributed():
        dist.destroy_process_group()


def _object_group(group: Optional["dist.ProcessGroup"]) -> "dist.ProcessGroup":
    return object_collective_group() if group is None else group


def all_gather(obj: Any, group: Optional["dist.ProcessGroup"] = None) -> List[Any]:
    """Gather a picklable object from every rank of `group`.

    Args:
        obj: any picklable object.
        group: process group (default: all ranks, over gloo).

    Returns:
        list: one object per rank of the group, in rank order (``[obj]`` without a
        process group).
    """
    if get_world_size() == 1:
        return [obj]
    group = _object_group(group)
    size = dist.get_world_size(group=group)
    if size == 1:
        return [obj]
    output: List[Any] = [None] * size
    dist.all_gather_object(output, obj, group=group)
    return output


def gather(obj: Any, dst: int = 0, group: Optional["dist.ProcessGroup"] = None) -> List[Any]:
    """Gather a picklable object from every rank of `group` on rank `dst`.

    Args:
        obj: any picklable object.
        dst: global rank that receives the objects.
        group: process group (default: all ranks, over gloo).

    Returns:
        list: on `dst`, one object per rank of the group in rank order; on the other
        ranks an empty list. ``[obj]`` without a process group.
    """
    if get_world_size() == 1:
        return [obj]
    group = _object_group(group)
    size = dist.get_world_size(group=group)
    if size == 1:
        return [obj]
    if dist.get_rank() == dst:
        output: Optional[List[Any]] = [None] * size
        dist.gather_object(obj, output, dst=dst, group=group)
        return output
    dist.gather_object(obj, None, dst=dst, group=group)
    return []


def shared_random_seed() -> int:
    """Return a random integer in [0, 2**31) that is the same on every rank.

    Rank 0 draws it from numpy's global RNG and the others take rank 0's value, so
    every worker can seed identical randomness (e.g. a shared sampler order).
    """
    seed = int(np.random.randint(2**31))
    return int(all_gather(seed)[0])


def reduce_dict(input_dict: Dict[str, torch.Tensor], average: bool = True) -> Dict[str, torch.Tensor]:
    """Sum (or average) a dict of scalar tensors over all ranks.

    Every rank must pass the same keys. Unlike detectron2's version, the result is
    returned on *every* rank (an all-reduce), not only on rank 0.

    Args:
        input_dict: name -> scalar tensor (on a device the backend supports: CUDA for
            NCCL, CPU for gloo).
        average: divide the sums by the world size.

    Returns:
        dict: same keys, reduced values (the input itself for world size 1).
    """
    world_size = get_world_size()
    if world_size < 2:
        return input_dict
    with torch.no_grad():
        names = sorted(input_dict)  # identical order on every rank
        values = torch.stack([input_dict[k].detach().reshape(()) for k in names])
        dist.all_reduce(values)
        if average:
            values = values / world_size
    return dict(zip(names, values))


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DataParallel / DistributedDataParallel wrapper, or the model itself.

    Args:
        model: a model, wrapped or not.

    Returns:
        the unwrapped module.
    """
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    return model.module if isinstance(model, wrappers) else model
