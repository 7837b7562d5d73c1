"""The marker for errors a user can fix from the command line.

An error of this kind carries a one-line message that names the problem and the fix;
the command line prints that line alone instead of a traceback.
"""

__all__ = ["ReidUserError", "DeviceUnavailableError", "InvalidDeviceError"]


class ReidUserError(Exception):
    """Base of every user-fixable error (bad config, missing data, bad checkpoint...)."""


class DeviceUnavailableError(ReidUserError, RuntimeError):
    """MODEL.DEVICE names a device this machine does not have."""


class InvalidDeviceError(ReidUserError, ValueError):
    """MODEL.DEVICE is not a device name torch understands."""
