"""Config: `get_cfg()` returns the full default tree (see docs and config-schema)."""
from .compat import INERT_KEYS, inert_keys_set, warn_inert_keys
from .config import CfgNode, ConfigError, load_yaml_with_bases
from .defaults import _C


def get_cfg() -> CfgNode:
    """Return a fresh copy of the default config with every key of the schema.

    Returns:
        CfgNode: an unfrozen copy that callers may merge into.
    """
    return _C.clone()


__all__ = ["CfgNode", "ConfigError", "INERT_KEYS", "get_cfg", "inert_keys_set", "load_yaml_with_bases", "warn_inert_keys"]
