"""Wrapping a model for several workers (DistributedDataParallel), and finding a wrapped model's device."""
import torch
from torch.nn.parallel import DistributedDataParallel

from ..utils import comm

__all__ = ["create_ddp_model", "model_device"]


def create_ddp_model(model: torch.nn.Module, *, broadcast_buffers: bool = False, **kwargs) -> torch.nn.Module:
    """Wrap a model in DistributedDataParallel when the world size is above 1.

    Args:
        model: the model (already on its device).
        broadcast_buffers: DDP's flag; BN statistics stay per worker by default.
    Returns:
        the DDP-wrapped model, or the model itself in a single-process run.
    """
    if comm.get_world_size() == 1:
        return model
    if "device_ids" not in kwargs and next(model.parameters()).device.type == "cuda":
        kwargs["device_ids"] = [comm.get_local_rank()]
    return DistributedDataParallel(model, broadcast_buffers=broadcast_buffers, **kwargs)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a (possibly DDP-wrapped) model's first parameter."""
    return next(model.parameters()).device
