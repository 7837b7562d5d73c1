"""The error of a dataset whose content is unusable, in a module of its own (outside ``datasets/``) so
that the file audit, the dataset base class and the synthetic generator (which ``datasets/``
imports) all raise it without an import circle."""

from ..utils.errors import ReidUserError

__all__ = ["DatasetFormatError"]


class DatasetFormatError(ReidUserError, ValueError):
    """A dataset was found but its content is unusable (empty split, bad names, no matches)."""
