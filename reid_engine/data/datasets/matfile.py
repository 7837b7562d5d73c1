"""A reader of MATLAB level-5 ``.mat`` files (v5 / v6 / v7, not the HDF5-based v7.3), without scipy.

Benchmark releases ship their splits in such files (GRID's ``features_and_partitions.mat``).
Read are numeric and logical arrays, char arrays, cell arrays and structs, compressed or
not; sparse arrays and objects are refused with a clear error. Values come back like
scipy's ``loadmat`` gives them: numeric arrays as numpy arrays of the stored shape, cells
as object arrays, strings as ``str``, and a struct array as an object array of dicts
(field name -> value, in the file's field order).
"""

import struct
import zlib
from typing import Any, Dict, Tuple

import numpy as np

from .bases import DatasetFormatError

__all__ = ["MatFileError", "read_mat"]

# Data types of the element tags (miINT8 ...) as numpy dtypes, without byte order.
_NUMERIC_TYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8"}
_MI_MATRIX, _MI_COMPRESSED, _MI_UTF8, _MI_UTF16, _MI_UTF32 = 14, 15, 16, 17, 18
# Array classes (mxCELL_CLASS ...) of the array-flags subelement.
_CELL, _STRUCT, _OBJECT, _CHAR, _SPARSE = 1, 2, 3, 4, 5
_NUMERIC_CLASSES = {6: "f8", 7: "f4", 8: "i1", 9: "u1", 10: "i2", 11: "u2", 12: "i4", 13: "u4", 14: "i8", 15: "u8"}
_COMPLEX_FLAG, _LOGICAL_FLAG = 0x0800, 0x0200


class MatFileError(DatasetFormatError):
    """A ``.mat`` file this reader cannot read (corrupt, v7.3 / HDF5, or an unsupported array)."""


class _Reader:
    """Walks the data elements of a level-5 file body (one instance per byte buffer)."""

    def __init__(self, data: bytes, order: str, path: str):
        self.data, self.order, self.path, self.pos = data, order, path, 0

    def fail(self, what: str) -> MatFileError:
        return MatFileError(f"cannot read the MATLAB file '{self.path}': {what}; restore the file from the "
                            f"dataset release")

    def tag(self) -> Tuple[int, int, bool]:
        """Read a tag: ``(data type, byte count, small element)``."""
        if self.pos + 8 > len(self.data):
            raise self.fail("it ends inside a data element")
        first, second = struct.unpack_from(self.order + "II", self.data, self.pos)
        if first >> 16:  # small element: type and size packed in 4 bytes, data in the next 4
            self.pos += 4
            return first & 0xFFFF, first >> 16, True
        self.pos += 8
        return first, second, False

    def element(self) -> Tuple[int, bytes]:
        """Read one data element: ``(data type, payload)``, skipping the padding after it."""
        mtype, nbytes, small = self.tag()
        end = self.pos + nbytes
        if end > len(self.data):
            raise self.fail("a data element runs past the end of the file")
        payload = self.data[self.pos:end]
        if small:
            self.pos += 4
        elif mtype == _MI_COMPRESSED:
            self.pos = end  # compressed elements are not padded
        else:
            self.pos = end + (-nbytes % 8)
        return mtype, payload

    def numbers(self, mtype: int, payload: bytes) -> np.ndarray:
        if mtype not in _NUMERIC_TYPES:
            raise self.fail(f"unexpected data type {mtype} for numbers")
        return np.frombuffer(payload, dtype=np.dtype(self.order + _NUMERIC_TYPES[mtype]))

    def variable(self) -> Tuple[str, Any]:
        """Read the next top-level variable: ``(name, value)``."""
        mtype, payload = self.element()
        if mtype == _MI_COMPRESSED:
            try:
                payload = zlib.decompress(payload)
            except zlib.error as e:
                raise self.fail(f"a compressed variable is corrupt ({e})") from None
            return _Reader(payload, self.order, self.path).variable()
        if mtype != _MI_MATRIX:
            raise self.fail(f"unexpected top-level data type {mtype}")
        return _Reader(payload, self.order, self.path).matrix()

    def matrix(self) -> Tuple[str, Any]:
        """Read the body of a miMATRIX element (this reader holds exactly that body)."""
        if not self.data:  # an empty matrix (e.g. an empty cell)
            return "", np.zeros((0, 0))
        flags = self.numbers(*self.element())
        array_class, flag_bits = int(flags[0]) & 0xFF, int(flags[0])
        dims = tuple(int(d) for d in self.numbers(*self.element()))
        name = self.element()[1].decode("latin-1")
        count = int(np.prod(dims)) if dims else 0
        if array_class in _NUMERIC_CLASSES:
            values = self.numbers(*self.element()).astype(_NUMERIC_CLASSES[array_class])
            if flag_bits & _COMPLEX_FLAG:
                values = values + 1j * self.numbers(*self.element())
            if flag_bits & _LOGICAL_FLAG:
                values = values.astype(bool)
            return name, values.reshape(dims, order="F")
        if array_class == _CHAR:
            mtype, payload = self.element()
            if mtype in (_MI_UTF8, 2, 1):
                return name, payload.decode("utf-8")
            encoding = {_MI_UTF16: "utf-16", 4: "utf-16", _MI_UTF32: "utf-32"}.get(mtype)
            if encoding is None:
                raise self.fail(f"unexpected data type {mtype} for characters")
            return name, payload.decode(encoding + ("-le" if self.order == "<" else "-be"))
        if array_class == _CELL:
            cells = np.empty(count, dtype=object)
            for i in range(count):
                cells[i] = self._nested()
            return name, cells.reshape(dims, order="F")
        if array_class == _STRUCT:
            field_length = int(self.numbers(*self.element())[0])
            raw = self.element()[1]
            fields = [raw[i:i + field_length].split(b"\0", 1)[0].decode("latin-1")
                      for i in range(0, len(raw), field_length)] if field_length else []
            records = np.empty(count, dtype=object)
            for i in range(count):
                records[i] = {field: self._nested() for field in fields}
            return name, records.reshape(dims, order="F")
        kind = {_OBJECT: "objects", _SPARSE: "sparse arrays"}.get(array_class, f"array class {array_class}")
        raise self.fail(f"it holds {kind}, which this reader does not support")

    def _nested(self) -> Any:
        mtype, payload = self.element()
        if mtype != _MI_MATRIX:
            raise self.fail(f"unexpected data type {mtype} inside a cell or struct")
        return _Reader(payload, self.order, self.path).matrix()[1]


def read_mat(path: str) -> Dict[str, Any]:
    """Read every variable of a level-5 ``.mat`` file.

    Args:
        path: the file.
    Returns:
        ``{variable name: value}`` (see the module docstring for the value types).
    Raises:
        MatFileError: not a level-5 file (e.g. v7.3 / HDF5), corrupt, or holding sparse
            arrays or objects (one line naming the file).
        OSError: the file cannot be opened.
    """
    with open(path, "rb") as f:
        data = f.read()
    endian = data[126:128]
    version = data[124:126] if endian == b"IM" else data[125:123:-1]
    if len(data) < 128 or endian not in (b"IM", b"MI") or version != b"\x00\x01":
        raise _Reader(b"", "<", path).fail("it is not a MATLAB level-5 file (v7.3 files are HDF5; save it with "
                                           "-v7 or older)")
    reader = _Reader(data[128:], "<" if endian == b"IM" else ">", path)
    variables = {}
    while reader.pos < len(reader.data):
        name, value = reader.variable()
        variables[name] = value
    return variables
