"""Registries (name -> builder) and the one lookup that turns a config value into a choice.

The build contract, shared by every registry of the package
-----------------------------------------------------------
A registry maps a name (the config value) to a *builder*: a function, or a class.
``REGISTRY.build(name, *args, key=KEY, **kwargs)`` looks ``name`` up (an unknown name
raises :class:`UnknownChoiceError` naming ``KEY``, the accepted names and the closest
match) and returns the built object: a class with a ``from_config`` classmethod is built
with ``cls.from_config(*args, **kwargs)``, anything else with ``builder(*args, **kwargs)``.
A builder may also carry ``check_config(cfg)``: it validates the builder's own config
values without building anything; ``REGISTRY.check_config(cfg)`` looks up the name the
config holds at the registry's ``key`` and runs it, so a wrong value fails before any
slow work.

The arguments, per registry:

- whole-config parts, built from the config: ``(cfg, *extras)``

  - ``META_ARCH_REGISTRY`` (MODEL.META_ARCHITECTURE): ``(cfg)`` -> nn.Module
  - ``BACKBONE_REGISTRY`` (MODEL.BACKBONE.NAME): ``(cfg)`` -> nn.Module with an int
    ``out_channels``, the channels of the map it returns
  - ``HEADS_REGISTRY`` (MODEL.HEADS.NAME): ``(cfg, in_channels)`` -> nn.Module;
    ``in_channels`` is the backbone's ``out_channels``
  - ``LOSS_REGISTRY`` (an entry of MODEL.LOSSES.NAME): ``(cfg)`` -> callable
    ``(head outputs, targets) -> {name: scaled loss}``

- parts built from plain values (usable without a config):

  - ``POOLING_REGISTRY`` (MODEL.HEADS.POOL_LAYER): ``()`` -> nn.Module
  - ``CLS_LAYER_REGISTRY`` (MODEL.HEADS.CLS_LAYER): ``(num_classes, scale, margin)``
  - ``DATASET_REGISTRY`` (DATASETS.NAMES / TESTS): ``(root=, combineall=, **kwargs)``
    -> ImageDataset
  - ``SAMPLER_REGISTRY`` (DATALOADER.SAMPLER_TRAIN): ``(data_source, mini_batch_size,
    *, seed, rank, world_size, **extra)`` -> InfiniteSampler; ``cls.extra_args`` names
    the extras it wants; override ``world_size_dependence()`` to return why, if its global
    stream depends on the number of workers (``--resume`` on another count then refuses)

Fixed enumerations that are not registries (a ResNet depth, a norm name, ...) are
checked with :func:`lookup` / :func:`check_choice`, which raise the same error.
"""
import difflib
from typing import Any, Iterable, List, Mapping, Optional, Union

from fvcore.common.registry import Registry as _FvcoreRegistry

from .errors import USAGE_EXIT_CODE, ReidUserError

__all__ = ["Registry", "UnknownChoiceError", "lookup", "check_choice", "closest_match",
           "unknown_choice_message", "registry_for_key"]


class UnknownChoiceError(ReidUserError, KeyError, ValueError):
    """A config value that is not one of the accepted names (one line: key, choices, closest).

    A wrong value is a usage error: the command line exits with 2, like a wrong key.
    """

    exit_code = USAGE_EXIT_CODE

    def __str__(self) -> str:
        # KeyError would print the repr of the message (with quotes).
        return str(self.args[0]) if self.args else ""


def closest_match(value: Any, choices: Iterable[str]) -> Optional[str]:
    """Return the choice closest to ``value``, or None.

    Tried in order: the same name in other case, the closest spelling (difflib), the
    only choice that contains ``value``.

    Args:
        value: the wrong value.
        choices: the accepted names.
    Returns:
        The closest accepted name, or None when none is close.
    """
    choices = [str(c) for c in choices]
    text = str(value)
    by_case = {c.lower(): c for c in choices}
    if text.lower() in by_case:
        return by_case[text.lower()]
    close = difflib.get_close_matches(text.lower(), list(by_case), n=1, cutoff=0.6)
    if close:
        return by_case[close[0]]
    containing = [c for c in choices if text and text.lower() in c.lower()]
    return containing[0] if len(containing) == 1 else None


def unknown_choice_message(value: Any, choices: Iterable[str], key: str, hint: str = "") -> str:
    """The one-line ``unknown KEY 'value': choose one of A, B; did you mean X?`` message.

    Args:
        value: the wrong value.
        choices: the accepted names, in the order to show them.
        key: the config key (or argument) that holds the value.
        hint: optional extra advice appended after a ``;``.
    Returns:
        The message, on one line.
    """
    names = [str(c) for c in choices]
    message = f"unknown {key} '{value}': choose one of {', '.join(names)}"
    match = closest_match(value, names)
    if match is not None:
        message += f"; did you mean {match}?"
    if hint:
        message += f"; {hint}"
    return message


def _names(choices) -> List[str]:
    if isinstance(choices, _FvcoreRegistry):
        return sorted(name for name, _ in choices)
    return [str(c) for c in choices]


def check_choice(value: Any, choices: Iterable, key: str, hint: str = "") -> Any:
    """Return ``value`` if it is one of ``choices``, else raise :class:`UnknownChoiceError`.

    Args:
        value: the config value.
        choices: the accepted values (any iterable of names, a mapping or a registry).
        key: the config key, named in the message.
        hint: optional extra advice for the message.
    Returns:
        ``value`` unchanged.
    Raises:
        UnknownChoiceError: ``value`` is not accepted.
    """
    names = _names(choices)
    if not isinstance(value, str) or value not in names:
        raise UnknownChoiceError(unknown_choice_message(value, names, key, hint))
    return value


def lookup(choices: Union[Mapping[str, Any], "_FvcoreRegistry"], value: Any, key: str, hint: str = "") -> Any:
    """Return the entry registered under ``value`` in a mapping or registry.

    Args:
        choices: a dict-like mapping or a :class:`Registry`.
        value: the config value (the name).
        key: the config key, named in the message.
        hint: optional extra advice for the message.
    Returns:
        The registered object.
    Raises:
        UnknownChoiceError: ``value`` is not a registered name.
    """
    check_choice(value, choices, key, hint)
    if isinstance(choices, _FvcoreRegistry):
        return _FvcoreRegistry.get(choices, value)
    return choices[value]


# The first registry made for each config key: lower layers (the run plan) look a registered
# class up by the key that names it, without importing the package that defines the registry.
_BY_KEY: dict = {}


def registry_for_key(key: str) -> Optional["Registry"]:
    """The registry whose names the config key `key` holds, or None while none is loaded.

    Args:
        key: a config key, e.g. "MODEL.META_ARCHITECTURE".
    """
    return _BY_KEY.get(key)


class Registry(_FvcoreRegistry):
    """fvcore's Registry with a one-line, suggesting lookup and the package's build contract.

    Args:
        name: the registry's name (shown in fvcore's messages and repr).
        key: the config key that holds the name to build (e.g. "MODEL.BACKBONE.NAME"),
            named in errors and read by :meth:`check_config`.
    """

    def __init__(self, name: str, key: Optional[str] = None):
        super().__init__(name)
        self.key = key
        if key is not None:
            _BY_KEY.setdefault(key, self)

    def names(self) -> List[str]:
        """The registered names, sorted."""
        return _names(self)

    def get(self, name: str, key: Optional[str] = None) -> Any:
        """Return the builder registered as ``name``.

        Args:
            name: the registered name.
            key: the config key that holds ``name`` (for the message); default: the
                registry's name.
        Raises:
            UnknownChoiceError: nothing is registered as ``name``.
        """
        return lookup(self, name, key or self.key or self._name)

    def build(self, name: str, *args, key: Optional[str] = None, **kwargs) -> Any:
        """Look ``name`` up and build it by the module's build contract (see the module doc).

        Args:
            name: the registered name.
            *args, **kwargs: the registry's build arguments.
            key: the config key that holds ``name`` (for the message).
        Returns:
            ``builder.from_config(*args, **kwargs)`` for a class with ``from_config``,
            else ``builder(*args, **kwargs)``.
        """
        builder = self.get(name, key=key)
        if isinstance(builder, type) and hasattr(builder, "from_config"):
            return builder.from_config(*args, **kwargs)
        return builder(*args, **kwargs)

    def check_config(self, cfg) -> Any:
        """Look up the name the config holds at this registry's ``key`` and run the
        builder's ``check_config(cfg)`` if it has one; builds nothing.

        Args:
            cfg: the config tree.
        Returns:
            The builder.
        Raises:
            UnknownChoiceError: an unknown name or value (one line: key, choices, closest).
        """
        name = cfg
        for part in self.key.split("."):
            name = name[part]
        builder = self.get(name)
        check = getattr(builder, "check_config", None)
        if check is not None:
            check(cfg)
        return builder
