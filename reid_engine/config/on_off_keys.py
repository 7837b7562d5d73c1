"""The string keys that also accept a YAML boolean, read by the merge checks.

Its own module so that `config` (which coerces values) and `defaults` (which builds the
tree with `config.CfgNode`) both import it one way.
"""

__all__ = ["ON_OFF_KEYS", "ON_OFF_CHOICES"]

#: the values of an on/off key (each key's checker reads them)
ON_OFF_CHOICES = ("auto", "on", "off")

# Every string key whose values are ON_OFF_CHOICES also accepts a YAML boolean: true -> "on",
# false -> "off" (YAML 1.1 reads a bare on / off as a boolean, a user writes False, and older
# files wrote MODEL.COMPILE: True). tests/config/test_on_off_keys.py keeps the set complete.
ON_OFF_KEYS = frozenset({"MODEL.CHANNELS_LAST", "MODEL.COMPILE", "INPUT.DEVICE_AUGMENT", "DATALOADER.CACHE_IMAGES"})
