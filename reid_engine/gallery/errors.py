"""The one-line errors of the gallery index: each names the problem and the fix."""
from ..utils.errors import ReidUserError, UsageError

__all__ = ["IndexFileError", "ModelMismatchError", "UnknownFieldError", "BackendUnreachableError",
           "QueryInputError", "BuildStopped"]


class IndexFileError(ReidUserError, OSError):
    """An index file is missing, unreadable or not an index written by reid-index."""


class ModelMismatchError(ReidUserError, ValueError):
    """A query (or added items) embedded by another model, or features of another dimension."""


class UnknownFieldError(UsageError):
    """A filter names a metadata field the index does not hold."""


class BackendUnreachableError(ReidUserError, ConnectionError):
    """The Milvus server at the given URI does not answer."""


class QueryInputError(ReidUserError, ValueError):
    """A query image or feature file that cannot be read."""


class BuildStopped(ReidUserError):
    """A build or add stopped by SIGTERM: what is embedded is kept, the same command continues it."""

    exit_code = 143  # 128 + SIGTERM, what a shell reports for a process ended by the signal
