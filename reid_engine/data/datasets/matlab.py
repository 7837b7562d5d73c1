"""Opening the MATLAB ``.mat`` files of dataset releases: level-5 files with scipy, v7.3 (HDF5) files with h5py.

Both readers turn every way a file can be unreadable into one :class:`MatFileError` line
that names the file, so a damaged download stops a run with an error, not a traceback.
"""

from typing import Any, Dict

from .bases import DatasetFormatError

__all__ = ["MatFileError", "read_mat", "open_mat_v73"]

_RESTORE = "restore the file from the dataset release"


class MatFileError(DatasetFormatError):
    """A ``.mat`` file that cannot be read (corrupt, truncated, or of the other MATLAB format)."""


def _is_hdf5(path: str) -> bool:
    """True if ``path`` is an HDF5 file (MATLAB v7.3 puts the HDF5 signature at byte 512)."""
    import h5py  # a dependency; imported here so the dataset modules load without touching it

    try:
        return h5py.is_hdf5(path)
    except OSError:
        return False


def read_mat(path: str) -> Dict[str, Any]:
    """Read the variables of a MATLAB level-5 file (v5 / v6 / v7) with ``scipy.io.loadmat``.

    Args:
        path: the ``.mat`` file.
    Returns:
        ``{name: value}`` as scipy gives them (numeric arrays keep their MATLAB shape, cells
        are object arrays, structs are record arrays), without scipy's ``__header__`` entries.
    Raises:
        MatFileError: the file cannot be read (one line naming it).
    """
    from scipy.io import loadmat

    try:
        data = loadmat(path)
    except Exception as e:  # noqa: BLE001 (scipy fails on damaged files with many exception types)
        if _is_hdf5(path):
            reason = "it is a MATLAB v7.3 (HDF5) file where a level-5 (v5 / v7) file was expected"
        else:
            reason = f"{type(e).__name__}: {' '.join(str(e).split()) or 'unreadable'}"
        raise MatFileError(f"cannot read the MATLAB file '{path}' ({reason}); {_RESTORE}") from None
    return {k: v for k, v in data.items() if not k.startswith("__")}


def open_mat_v73(path: str):
    """Open a MATLAB v7.3 file (HDF5) for reading with h5py.

    Args:
        path: the ``.mat`` file.
    Returns:
        The open ``h5py.File`` (use it as a context manager). Variables are datasets whose
        arrays are transposed against MATLAB's; cells hold object references.
    Raises:
        MatFileError: the file is not HDF5 (one line naming it).
    """
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise MatFileError(f"cannot read the MATLAB v7.3 file '{path}' ({' '.join(str(e).split())}); "
                           f"{_RESTORE}") from None
