"""The usual initialisation of convolutional trunks (ResNet family, MobileNets, OSNet)."""
from torch import nn

__all__ = ["init_fan_out"]

_NORMS = (nn.BatchNorm2d, nn.SyncBatchNorm, nn.GroupNorm, nn.InstanceNorm2d)


def init_fan_out(model: nn.Module) -> None:
    """Kaiming-normal (fan_out, ReLU gain) conv weights and zero conv biases; affine norm
    weight 1 / bias 0; for every module of `model`, in module order.

    Args:
        model: the module to initialise in place.
    """
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, _NORMS) and isinstance(module.weight, nn.Parameter):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
