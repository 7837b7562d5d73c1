"""`Registry` (name -> class or function) is fvcore's, re-exported so the package has one import path."""
from fvcore.common.registry import Registry  # noqa: F401

__all__ = ["Registry"]
