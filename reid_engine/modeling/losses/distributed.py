"""Gathering a per-worker batch across workers for losses that compare samples."""
import torch
import torch.distributed as dist

__all__ = ["gather_with_local_grad"]


def _world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def gather_with_local_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every worker along dim 0, in rank order.

    The local slice is the caller's tensor itself, so gradients flow back to it; the
    other workers' slices are constants. Every worker must pass the same shape.
    With one process (or no process group) the tensor is returned unchanged.

    Args:
        tensor: (B, ...) tensor of this worker.

    Returns:
        Tensor: (world_size * B, ...).
    """
    world_size = _world_size()
    if world_size == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(parts, tensor.detach().contiguous())
    parts[dist.get_rank()] = tensor
    return torch.cat(parts, dim=0)
