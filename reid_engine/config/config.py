"""A yacs/fvcore CfgNode with `_BASE_` chains, safe YAML and one-line errors.

Users hit config errors more than any other; each one here names the key, what was
expected and the fix, and unknown keys come with the closest existing names.
"""
import copy
import difflib
import os
from typing import Any, Dict, List, Optional

import yaml
from fvcore.common.config import CfgNode as _FvcoreCfgNode

from ..utils.errors import ConfigError  # defined in utils: runtime and reliability, beside config, raise it too
from .on_off_keys import ON_OFF_KEYS

BASE_KEY = "_BASE_"

__all__ = ["CfgNode", "ConfigError", "did_you_mean", "load_yaml_with_bases"]


def _full_keys(node, prefix="") -> List[str]:
    keys = []
    for k, v in node.items():
        name = prefix + k
        keys.append(name)
        if isinstance(v, dict):
            keys.extend(_full_keys(v, name + "."))
    return keys


def _suggest(key: str, candidates: List[str]) -> str:
    """A ' Did you mean ...?' suffix with the closest candidates, or ''."""
    close = difflib.get_close_matches(key, candidates, n=3, cutoff=0.6)
    if not close:
        # A misspelt last component under the right parent is the common case.
        leaf = key.rsplit(".", 1)[-1]
        leaves = {c.rsplit(".", 1)[-1]: c for c in candidates}
        close = [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves), n=3, cutoff=0.7)]
    return f" Did you mean: {', '.join(close)}?" if close else ""


def did_you_mean(name: str, candidates: List[str]) -> str:
    """The ' Did you mean: A, B?' suffix of an error line for a misspelt name, or ''.

    Args:
        name: the name the user wrote (a dotted config key or a plain word).
        candidates: the names that exist.
    """
    return _suggest(name, list(candidates))


def _type_name(value) -> str:
    return type(value).__name__


def _coerce(key: str, new, old):
    """Return `new` converted to the type of `old`, or raise ConfigError.

    Lists and tuples are interchangeable; ints are accepted for floats; a float with
    an integral value is accepted for an int. Anything else must match exactly.
    """
    if old is None or new is None or type(new) is type(old):
        return new
    if isinstance(old, str) and isinstance(new, bool) and key in ON_OFF_KEYS:
        return "on" if new else "off"
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return type(old)(new)
    if isinstance(old, (list, tuple)) and isinstance(new, str):
        # A bare word for a list key, e.g. DATASETS.NAMES Market1501.
        return type(old)([new])
    if isinstance(old, float) and isinstance(new, int) and not isinstance(new, bool):
        return float(new)
    if isinstance(old, int) and not isinstance(old, bool) and isinstance(new, float) and new.is_integer():
        return int(new)
    raise ConfigError(
        f"Config key {key} expects {_type_name(old)} (default {old!r}), got {_type_name(new)} {new!r}."
    )


def _decode(value):
    """Decode a YAML/command-line string the way yacs does (literal_eval), else keep it."""
    return _FvcoreCfgNode._decode_cfg_value(value)


def _merge_dict_into(src: Dict[str, Any], dst: "CfgNode", prefix: str, source: str, all_keys: List[str]):
    """Merge a plain (possibly nested) dict into an existing CfgNode with checks."""
    for k, v in src.items():
        full = prefix + k
        if k not in dst:
            raise ConfigError(f"Unknown config key {full} in {source}.{_suggest(full, all_keys)}")
        old = dst[k]
        if isinstance(old, _FvcoreCfgNode):
            if not isinstance(v, dict):
                raise ConfigError(
                    f"Config key {full} is a section ({', '.join(list(old.keys())[:4])}, ...) "
                    f"and needs a mapping in {source}, got {_type_name(v)} {v!r}."
                )
            _merge_dict_into(v, old, full + ".", source, all_keys)
            continue
        if isinstance(v, dict):
            raise ConfigError(f"Config key {full} is a value, not a section, in {source}: got mapping {v!r}.")
        v = _decode(copy.deepcopy(v))
        dst[k] = _coerce(full, v, old)


def load_yaml_with_bases(filename: str, _seen: Optional[List[str]] = None) -> Dict[str, Any]:
    """Load a YAML file with safe_load and resolve its `_BASE_` chain.

    Args:
        filename: the YAML file; `_BASE_` entries (a string or a list) are relative
            to its folder unless absolute.
    Returns:
        a plain nested dict with the bases merged in order and the file's own values
        winning.
    """
    filename = os.path.abspath(os.path.expanduser(filename))
    if not os.path.isfile(filename):
        raise ConfigError(f"Config file not found: {filename} (check the --config-file path).")
    seen = list(_seen or [])
    if filename in seen:
        raise ConfigError(f"Config _BASE_ cycle: {' -> '.join(seen + [filename])}.")
    seen.append(filename)
    try:
        with open(filename, "r", encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"Config file {filename} is not valid YAML: {first}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {filename} must hold a mapping of keys, got {_type_name(data)}.")
    bases = data.pop(BASE_KEY, None)
    if bases is None:
        return data
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{BASE_KEY} in {filename} must be a file name or a list of file names.")
    merged: Dict[str, Any] = {}
    for base in bases:
        base_path = os.path.expanduser(base)
        if not os.path.isabs(base_path):
            base_path = os.path.join(os.path.dirname(filename), base_path)
        if not os.path.isfile(base_path):
            raise ConfigError(f"Config file {filename} names a {BASE_KEY} that does not exist: {base_path}.")
        _deep_update(merged, load_yaml_with_bases(base_path, seen))
    _deep_update(merged, data)
    return merged


def _deep_update(dst: Dict[str, Any], src: Dict[str, Any]):
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


class CfgNode(_FvcoreCfgNode):
    """The project's config node: fvcore/yacs CfgNode with friendlier merging.

    `merge_from_file` resolves `_BASE_` (string or list, relative to the file) and
    only ever uses `yaml.safe_load`; `merge_from_list` takes `KEY VALUE` pairs.
    Problems raise `ConfigError` with one clear line.
    """

    def merge_from_file(self, cfg_filename: str, allow_unsafe: bool = False) -> None:
        """Merge a YAML file (and its `_BASE_` chain) into this config.

        Args:
            cfg_filename: path of the YAML file.
            allow_unsafe: ignored; YAML is always loaded safely.
        """
        data = load_yaml_with_bases(cfg_filename)
        self.merge_from_dict(data, source=os.path.abspath(cfg_filename))

    def merge_from_dict(self, data: Dict[str, Any], source: str = "a dict") -> None:
        """Merge a nested dict of overrides, checking every key and type.

        Args:
            data: nested mapping of keys to values.
            source: where the values came from, named in errors.
        """
        if self.is_frozen():
            raise ConfigError("Cannot merge into a frozen config: call cfg.defrost() first.")
        _merge_dict_into(data, self, "", source, _full_keys(self))

    def merge_from_other_cfg(self, cfg_other) -> None:
        """Merge another CfgNode into this one with the same checks."""
        self.merge_from_dict(cfg_other, source="another config")

    def merge_from_list(self, cfg_list: List[Any]) -> None:
        """Merge `KEY VALUE` pairs such as `["SOLVER.BASE_LR", "0.01"]`.

        Args:
            cfg_list: flat list alternating full key names and values (strings are
                decoded as Python literals where possible).
        """
        cfg_list = list(cfg_list)
        if len(cfg_list) % 2 != 0:
            raise ConfigError(
                f"Config overrides must be KEY VALUE pairs, got an odd number ({len(cfg_list)}) of "
                f"tokens: {' '.join(map(str, cfg_list))}."
            )
        if self.is_frozen():
            raise ConfigError("Cannot merge into a frozen config: call cfg.defrost() first.")
        all_keys = _full_keys(self)
        for full_key, value in zip(cfg_list[0::2], cfg_list[1::2]):
            node = self
            parts = str(full_key).split(".")
            for i, part in enumerate(parts):
                if not isinstance(node, dict) or part not in node:
                    raise ConfigError(
                        f"Unknown config key {full_key} on the command line.{_suggest(str(full_key), all_keys)}"
                    )
                if i < len(parts) - 1:
                    node = node[part]
            old = node[parts[-1]]
            if isinstance(old, _FvcoreCfgNode):
                raise ConfigError(
                    f"Config key {full_key} is a section; override one of its keys, "
                    f"e.g. {full_key}.{next(iter(old.keys()))}."
                )
            node[parts[-1]] = _coerce(str(full_key), _decode(value), old)
