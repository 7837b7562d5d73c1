"""Keys kept only so that fast-reid config files load: warn when a run sets one."""
import logging
from typing import List

from .defaults import _C, INERT_KEYS

__all__ = ["INERT_KEYS", "inert_keys_set", "warn_inert_keys"]


def _value(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = node[part]
    return node


def inert_keys_set(cfg) -> List[str]:
    """Return the keys of INERT_KEYS whose value differs from the default (INERT_KEYS order).

    Args:
        cfg: a full config tree.
    Returns:
        the dotted key names, in INERT_KEYS order.
    """
    return [key for key in INERT_KEYS if _value(cfg, key) != _value(_C, key)]


def warn_inert_keys(cfg, logger: logging.Logger) -> List[str]:
    """Log one warning naming every fast-reid compatibility key the config sets.

    Args:
        cfg: a full config tree.
        logger: where the warning goes.
    Returns:
        the keys named (empty: no warning).
    """
    keys = inert_keys_set(cfg)
    if keys:
        named = "; ".join(f"{key} ({INERT_KEYS[key]})" for key in keys)
        logger.warning("no effect, kept only so that fast-reid config files load: %s", named)
    return keys
