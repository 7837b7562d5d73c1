"""ImageNet weights for the ResNet family, read by the shared safe checkpoint loader.

Accepted files: a state dict in torchvision's ResNet layout or IBN-Net's (``bn1.IN.*`` /
``bn1.BN.*``; our module names match both, so no key is renamed), bare or wrapped under
"state_dict" / "model", optionally with DataParallel's "module." prefix. The ImageNet
classifier (``fc.*``) is dropped. Nothing is downloaded.
"""
from typing import Any, Dict

from torch import nn

from ...utils.checkpoint import Checkpointer, CheckpointError, CheckpointNotFoundError
from ...utils.errors import ReidUserError

__all__ = ["PretrainPathError", "load_imagenet_weights"]

# ImageNet classifier weights have no place in a ReID backbone.
_DROPPED_PREFIXES = ("fc.", "module.fc.")


class PretrainPathError(ReidUserError, ValueError):
    """The pretrained-weights key is set to use weights but names no file."""


class _ImageNetWeightsLoader(Checkpointer):
    """A Checkpointer for ImageNet classifier files: drops ``fc.*`` and keeps the
    key-matching result (missing / unexpected / shape-skipped keys) for the caller."""

    incompatible: Any = None

    def _load_file(self, f: str) -> Dict[str, Any]:
        state_dict = super()._load_file(f)["model"]
        for key in [k for k in state_dict if k.startswith(_DROPPED_PREFIXES)]:
            del state_dict[key]  # in place: keeps the state dict's version metadata
        return {"model": state_dict}

    def _load_model(self, checkpoint: Any) -> Any:
        self.incompatible = super()._load_model(checkpoint)
        return self.incompatible


def load_imagenet_weights(model: nn.Module, path: str,
                          config_key: str = "MODEL.BACKBONE.PRETRAIN_PATH") -> Any:
    """Copy the matching tensors of a torchvision / IBN-Net weights file into `model`.

    Tensors with another shape are skipped; one summary of loaded, missing, unexpected
    and skipped keys is logged (the Checkpointer's).

    Args:
        model: the backbone.
        path: a local weights file.
        config_key: the config key named in errors.

    Returns:
        fvcore's incompatible-keys tuple: ``missing_keys``, ``unexpected_keys`` and
        ``incorrect_shapes`` (key, file shape, model shape).

    Raises:
        PretrainPathError: `path` is empty.
        CheckpointNotFoundError: no file at `path`.
        CheckpointError: the file is corrupt, unsafe or holds no state dict of tensors.
    """
    if not path:
        raise PretrainPathError(f"{config_key} is empty; set it to a local torchvision- or "
                                "IBN-Net-format ResNet weights file (nothing is downloaded)")
    loader = _ImageNetWeightsLoader(model, save_to_disk=False)
    try:
        loader.load(path, checkpointables=[])
    except CheckpointNotFoundError:
        raise CheckpointNotFoundError(
            f"{config_key}: no file at {path!r}; point it to a local torchvision- or "
            "IBN-Net-format ResNet weights file") from None
    except CheckpointError as e:
        raise CheckpointError(f"{config_key}: {e}") from None
    return loader.incompatible
