"""Config: `get_cfg()` returns the full default tree (see docs and config-schema)."""
from .config import CfgNode, ConfigError, load_yaml_with_bases
from .defaults import _C


def get_cfg() -> CfgNode:
    """Return a fresh copy of the default config with every key of the schema.

    Returns:
        CfgNode: an unfrozen copy that callers may merge into.
    """
    return _C.clone()


__all__ = ["CfgNode", "ConfigError", "get_cfg", "load_yaml_with_bases"]
