"""A minimal writer of MATLAB level-5 files for tests (doubles, cells, 1x1 structs), written from the format spec.

Its output was checked once against scipy.io.loadmat (scipy is not a dependency).
"""

import struct
import zlib
from typing import Dict, Sequence

import numpy as np

_MI_INT8, _MI_INT32, _MI_UINT32, _MI_DOUBLE, _MI_MATRIX, _MI_COMPRESSED = 1, 5, 6, 9, 14, 15
_CELL, _STRUCT, _DOUBLE = 1, 2, 6


def _element(mtype: int, payload: bytes) -> bytes:
    return struct.pack("<II", mtype, len(payload)) + payload + b"\0" * (-len(payload) % 8)


def _matrix(array_class: int, dims: Sequence[int], body: bytes, name: str = "") -> bytes:
    header = (_element(_MI_UINT32, struct.pack("<II", array_class, 0))
              + _element(_MI_INT32, struct.pack(f"<{len(dims)}i", *dims)) + _element(_MI_INT8, name.encode()))
    return _element(_MI_MATRIX, header + body)


def double(values, name: str = "") -> bytes:
    """A double array (2-D or more)."""
    array = np.atleast_2d(np.asarray(values, dtype="<f8"))
    return _matrix(_DOUBLE, array.shape, _element(_MI_DOUBLE, array.tobytes(order="F")), name)


def cell_row(elements: Sequence[bytes], name: str = "") -> bytes:
    """A 1 x N cell array of already built matrices."""
    return _matrix(_CELL, (1, len(elements)), b"".join(elements), name)


def struct_1x1(fields: Dict[str, bytes], name: str = "") -> bytes:
    """A 1 x 1 struct of already built matrices, fields in order."""
    length = max(len(f) for f in fields) + 1
    names = b"".join(f.encode().ljust(length, b"\0") for f in fields)
    body = _element(_MI_INT32, struct.pack("<i", length)) + _element(_MI_INT8, names) + b"".join(fields.values())
    return _matrix(_STRUCT, (1, 1), body, name)


def write_mat(path: str, variables: Sequence[bytes], compress: bool = False) -> str:
    """Write named matrices (built with ``name=``) to ``path``; each variable compressed if asked."""
    header = b"MATLAB 5.0 MAT-file, written by tests".ljust(116, b" ") + b"\0" * 8 + struct.pack("<H", 0x0100) + b"IM"
    body = b""
    for variable in variables:
        if compress:
            packed = zlib.compress(variable)
            body += struct.pack("<II", _MI_COMPRESSED, len(packed)) + packed
        else:
            body += variable
    with open(path, "wb") as f:
        f.write(header + body)
    return path


def grid_partitions_mat(path: str, partitions: Sequence[Sequence[int]], compress: bool = False) -> str:
    """GRID's features_and_partitions.mat: ``trainIdxAll``, a cell of structs whose 3rd field lists train ids."""
    cells = [struct_1x1({"trainIdx0": double([[k]]), "testIdx": double([[0, 0]]), "trainIdx": double([list(ids)])})
             for k, ids in enumerate(partitions)]
    return write_mat(path, [cell_row(cells, name="trainIdxAll"), double([[1.0, 2.0]], name="features")], compress)
