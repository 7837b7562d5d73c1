"""What the feature memories of label-free training share: similarity with an update in backward,
the momentum update, gathering the batch across workers, and loading a memory of another size."""

from typing import Callable, Dict, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .distributed import gather_with_local_grad

__all__ = ["memory_similarity", "momentum_update_", "gather_batch", "ResizableMemory"]


class _MemorySimilarity(torch.autograd.Function):
    """``inputs @ memory.T``; backward returns the input gradient, then calls ``on_backward``.

    The memory is updated in backward, as cluster contrast and CAP do: the gradient is
    computed against the memory the loss saw, and a forward that is never backpropagated
    (a loss computed for logging, under ``no_grad``) leaves the memory as it was.
    """

    @staticmethod
    def forward(ctx, inputs, memory, on_backward):  # noqa: D102
        ctx.memory, ctx.on_backward = memory, on_backward
        return inputs.mm(memory.t())

    @staticmethod
    def backward(ctx, grad_output):  # noqa: D102
        grad = grad_output.mm(ctx.memory.to(grad_output.dtype)) if ctx.needs_input_grad[0] else None
        ctx.on_backward()
        return grad, None, None


def memory_similarity(inputs: torch.Tensor, memory: torch.Tensor, on_backward: Callable[[], None]) -> torch.Tensor:
    """Similarities (B, M) of ``inputs`` (B, D) to the rows of ``memory`` (M, D); ``on_backward()`` runs in backward.

    Without autograd (``no_grad`` or inputs that need no gradient) ``on_backward`` never runs.
    """
    if torch.is_grad_enabled() and inputs.requires_grad:
        return _MemorySimilarity.apply(inputs, memory, on_backward)
    return inputs.mm(memory.t())


@torch.no_grad()
def momentum_update_(bank: torch.Tensor, rows: torch.Tensor, feats: torch.Tensor, momentum: float) -> None:
    """``bank[r] = normalise(momentum * bank[r] + (1 - momentum) * f)`` for each (r, f), in order.

    Sequential, so a row seen several times in the batch is updated once per sample, as in
    cluster contrast.

    Args:
        bank: (M, D) memory, updated in place.
        rows: (B,) row indices.
        feats: (B, D) the (normalised) features.
        momentum: the weight of the old row.
    """
    feats = feats.to(bank.dtype)
    for r, f in zip(rows.tolist(), feats):
        bank[r] = F.normalize(momentum * bank[r] + (1.0 - momentum) * f, dim=0)


@torch.no_grad()
def gather_batch(*tensors: torch.Tensor):
    """The batch of every worker concatenated in rank order (detached), or the tensors themselves in one process."""
    return tuple(gather_with_local_grad(t.detach()) for t in tensors)


class ResizableMemory(nn.Module):
    """A module whose memory buffers change size (one row per cluster / proxy) between re-clusterings.

    ``load_state_dict`` accepts buffers of another length: they are replaced by the
    checkpoint's (the number of clusters of the checkpoint's last clustering).
    """

    RESIZABLE: Iterable[str] = ()

    def _load_from_state_dict(self, state_dict: Dict[str, torch.Tensor], prefix: str, *args, **kwargs):
        for name in self.RESIZABLE:
            value = state_dict.get(prefix + name)
            current = getattr(self, name)
            if value is not None and value.shape != current.shape:
                setattr(self, name, torch.empty_like(value, device=current.device, dtype=current.dtype))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
