"""ImageNet weights from local files for every backbone family, read by the shared safe
checkpoint loader. Nothing is downloaded.

Each family registers how its common public release is laid out: a `rename` function that
maps the file's keys to our module names (identity where they already match), the
classifier prefixes to drop, and a `fingerprint` that recognises a file of that family. A
file is accepted bare or wrapped under "state_dict" / "model" / "model_state" (pycls),
optionally with DataParallel's "module." prefix. A file in which most of the model's tensors are not
found (by name and shape) is refused with one line that names the family the file looks
like and the family the config builds.
"""
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from torch import Tensor, nn

from ...utils.checkpoint import Checkpointer, CheckpointError, CheckpointNotFoundError
from ...utils.errors import ReidUserError

__all__ = ["PretrainPathError", "WeightsFamilyError", "WeightsFamily", "WEIGHT_FAMILIES",
           "register_weights_family", "detect_weights_family", "load_imagenet_weights", "rename_keys"]

StateDict = Dict[str, Tensor]

# Below this share of the model's tensors found in the file, the file is of another family.
_MIN_MATCHED_SHARE = 0.5


class PretrainPathError(ReidUserError, ValueError):
    """The pretrained-weights key is set to use weights but names no file."""


class WeightsFamilyError(ReidUserError, ValueError):
    """The weights file holds another backbone family's weights."""


@dataclass(frozen=True)
class WeightsFamily:
    """How a backbone family's public ImageNet weight files are laid out.

    Attributes:
        name: the family's display name (e.g. "OSNet"), used in messages.
        fingerprint: state dict (after unwrapping) -> True when it is this family's file.
        rename: state dict -> state dict in our module names (identity by default); it
            handles every accepted release of the family (e.g. torchvision's and timm's).
        dropped_prefixes: keys starting with these (the ImageNet classifier) are removed
            after renaming.
        releases: the accepted releases, for messages (e.g. "torchvision or timm").
    """

    name: str
    fingerprint: Callable[[Mapping[str, Tensor]], bool]
    rename: Callable[[StateDict], StateDict] = field(default=lambda state: state)
    dropped_prefixes: Tuple[str, ...] = ()
    releases: str = ""


#: family name -> WeightsFamily, filled by the backbone modules at import.
WEIGHT_FAMILIES: Dict[str, WeightsFamily] = {}


def register_weights_family(family: WeightsFamily) -> WeightsFamily:
    """Register a family's weight-file layout (name must be new); returns it."""
    if family.name in WEIGHT_FAMILIES:
        raise KeyError(f"weights family {family.name!r} is already registered")
    WEIGHT_FAMILIES[family.name] = family
    return family


def detect_weights_family(state: Mapping[str, Tensor]) -> Optional[str]:
    """The name of the first registered family whose fingerprint accepts `state`, or None."""
    for family in WEIGHT_FAMILIES.values():
        if _claims(family, state):
            return family.name
    return None


def _claims(family: WeightsFamily, state: Mapping[str, Tensor]) -> bool:
    """True when `family`'s fingerprint accepts `state` (a failing fingerprint: False)."""
    try:
        return bool(family.fingerprint(state))
    except (KeyError, IndexError, AttributeError, TypeError):
        return False


def _has(state: Mapping[str, Tensor], *keys: str) -> bool:
    """True when every key is in `state` (a helper for fingerprints)."""
    return all(key in state for key in keys)


Replacement = Union[str, Callable[["re.Match[str]"], str]]


def rename_keys(state: Mapping[str, Tensor], rules: Sequence[Tuple[str, Replacement]]) -> StateDict:
    """Rename state-dict keys by regular-expression rules applied in order to every key
    (the `rename` of most families).

    Args:
        state: the state dict.
        rules: (pattern, replacement) pairs for `re.sub`; keys no rule matches are kept.

    Returns:
        A new dict with the renamed keys (same tensors, same order).
    """
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in rules]
    renamed = {}
    for key, value in state.items():
        for pattern, replacement in compiled:
            key = pattern.sub(replacement, key)
        renamed[key] = value
    return renamed


def _strip_module_prefix(state: StateDict) -> StateDict:
    if state and all(key.startswith("module.") for key in state):
        return {key[len("module."):]: value for key, value in state.items()}
    return state


def _current_versions(model: nn.Module, state: StateDict) -> "OrderedDict[str, dict]":
    """Per-module version metadata for a renamed state dict (renaming lost the file's).

    Without metadata torch treats every module as saved before version 0.4, which breaks
    norms whose buffers changed since. The tensors are in today's layout, except that many
    releases omit BatchNorm's ``num_batches_tracked``: those norms keep the old version, so
    torch fills the counter in silently instead of reporting it missing.
    """
    versions = OrderedDict()
    for name, module in model.named_modules():
        counter = f"{name}.num_batches_tracked" if name else "num_batches_tracked"
        if isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats \
                and counter not in state:
            continue
        versions[name] = {"version": module._version}
    return versions


class _ImageNetWeightsLoader(Checkpointer):
    """A Checkpointer for ImageNet classifier files of one family: renames the keys, drops
    the classifier, refuses another family's file, and keeps the key-matching result
    (missing / unexpected / shape-skipped keys) for the caller."""

    incompatible: Any = None

    def __init__(self, model: nn.Module, family: WeightsFamily, config_key: str):
        super().__init__(model, save_to_disk=False)
        self.family = family
        self.config_key = config_key

    def _load_file(self, f: str) -> Dict[str, Any]:
        raw = _strip_module_prefix(dict(super()._load_file(f)["model"]))
        state = self.family.rename(dict(raw))
        state = OrderedDict((k, v) for k, v in state.items() if not k.startswith(self.family.dropped_prefixes))
        self._check_family(f, raw, state)
        state._metadata = _current_versions(self.model, state)
        return {"model": state}

    def _check_family(self, path: str, raw: StateDict, state: StateDict) -> None:
        expected = self.model.state_dict()
        matched = sum(1 for key, value in expected.items()
                      if key in state and tuple(state[key].shape) == tuple(value.shape))
        found = detect_weights_family(raw)
        # A related family's file can share many tensors (a ResNeSt file holds most of a
        # ResNet-50's): a file that another family claims and ours does not is refused too.
        claimed_by_other = found is not None and found != self.family.name and not _claims(self.family, raw)
        if matched >= _MIN_MATCHED_SHARE * len(expected) and not claimed_by_other:
            return
        wanted = self.family.name + (f" ({self.family.releases})" if self.family.releases else "")
        if found and found != self.family.name:
            raise WeightsFamilyError(
                f"{self.config_key}: {path} holds {found} weights, but the backbone is {self.family.name}; "
                f"point it to a {wanted} ImageNet file or change MODEL.BACKBONE.NAME")
        raise WeightsFamilyError(
            f"{self.config_key}: {path} matches only {matched} of the {len(expected)} tensors of this "
            f"{self.family.name} backbone (other depth or layout?); point it to a {wanted} ImageNet file "
            "of the same MODEL.BACKBONE.DEPTH")

    def _load_model(self, checkpoint: Any) -> Any:
        self.incompatible = super()._load_model(checkpoint)
        return self.incompatible


def load_imagenet_weights(model: nn.Module, path: str, family: str = "ResNet",
                          config_key: str = "MODEL.BACKBONE.PRETRAIN_PATH") -> Any:
    """Copy the matching tensors of a local ImageNet weights file of `family` into `model`.

    Tensors with another shape are skipped; one summary of loaded, missing, unexpected
    and skipped keys is logged (the Checkpointer's).

    Args:
        model: the backbone.
        path: a local weights file.
        family: the registered WeightsFamily name of the backbone.
        config_key: the config key named in errors.

    Returns:
        fvcore's incompatible-keys tuple: ``missing_keys``, ``unexpected_keys`` and
        ``incorrect_shapes`` (key, file shape, model shape).

    Raises:
        PretrainPathError: `path` is empty.
        CheckpointNotFoundError: no file at `path`.
        WeightsFamilyError: the file is another family's (or another depth's) weights.
        CheckpointError: the file is corrupt, unsafe or holds no state dict of tensors.
    """
    spec = WEIGHT_FAMILIES[family]
    what = f"{spec.name} weights file" + (f" ({spec.releases} layout)" if spec.releases else "")
    if not path:
        raise PretrainPathError(f"{config_key} is empty; set it to a local {what} "
                                "(nothing is downloaded) or set MODEL.BACKBONE.PRETRAIN False")
    loader = _ImageNetWeightsLoader(model, spec, config_key)
    try:
        loader.load(path, checkpointables=[])
    except CheckpointNotFoundError:
        raise CheckpointNotFoundError(
            f"{config_key}: no file at {path!r}; point it to a local {what}") from None
    except WeightsFamilyError:
        raise
    except CheckpointError as e:
        raise CheckpointError(f"{config_key}: {e}") from None
    return loader.incompatible


def _is_torchvision_resnet(state: Mapping[str, Tensor]) -> bool:
    # conv2 of layer1's first block is a dense 3x3 (ResNeXt's is grouped)
    if not _has(state, "conv1.weight", "layer1.0.conv1.weight"):
        return False
    conv2 = state.get("layer1.0.conv2.weight")
    return conv2 is None or conv2.shape[1] == conv2.shape[0]


register_weights_family(WeightsFamily(
    name="ResNet", fingerprint=_is_torchvision_resnet, dropped_prefixes=("fc.",),
    releases="torchvision or IBN-Net"))
