"""The string keys that also accept a YAML boolean, read by the merge checks.

Its own module so that `config` (which coerces values) and `defaults` (which builds the
tree with `config.CfgNode`) both import it one way.
"""

__all__ = ["ON_OFF_KEYS"]

# String keys that also accept a YAML boolean: true -> "on", false -> "off" (YAML 1.1 reads a
# bare on / off as a boolean, and older files wrote MODEL.COMPILE: True).
ON_OFF_KEYS = frozenset({"MODEL.CHANNELS_LAST", "MODEL.COMPILE"})
