"""Small helpers shared by the hooks."""
import datetime

from torch import nn


def _hms(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DataParallel/DDP wrapper (or the model itself)."""
    return model.module if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else model
