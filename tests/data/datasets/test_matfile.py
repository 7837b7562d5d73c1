"""The level-5 .mat reader on files from the test writer (whose output scipy reads the same)."""

import numpy as np
import pytest

from reid_engine.data.datasets.matfile import MatFileError, read_mat
from tests.data.datasets.mat_writer import cell_row, double, struct_1x1, write_mat


@pytest.mark.parametrize("compress", [False, True])
def test_numbers_cells_and_structs(tmp_path, compress):
    path = write_mat(str(tmp_path / "x.mat"), [
        double(np.arange(6).reshape(2, 3), name="m"),
        cell_row([double([[1.0]]), struct_1x1({"a": double([[2.0]]), "long_name": double([[3.0, 4.0]])})], name="c"),
    ], compress)
    variables = read_mat(path)
    assert sorted(variables) == ["c", "m"]
    np.testing.assert_array_equal(variables["m"], np.arange(6).reshape(2, 3))  # column-major order undone
    cells = variables["c"]
    assert cells.shape == (1, 2) and cells[0, 0].tolist() == [[1.0]]
    record = cells[0, 1][0, 0]
    assert list(record) == ["a", "long_name"] and record["long_name"].tolist() == [[3.0, 4.0]]


def test_unreadable_files_are_one_line_errors(tmp_path):
    hdf5 = tmp_path / "v73.mat"
    hdf5.write_bytes(b"MATLAB 7.3 MAT-file".ljust(124, b" ") + b"\x00\x02IM" + b"\x89HDF")
    with pytest.raises(MatFileError, match=r"v73.mat': it is not a MATLAB level-5 file \(v7.3 files are HDF5"):
        read_mat(str(hdf5))
    good = write_mat(str(tmp_path / "ok.mat"), [double([[1.0]], name="x")])
    (tmp_path / "cut.mat").write_bytes(open(good, "rb").read()[:-12])
    with pytest.raises(MatFileError, match="runs past the end"):
        read_mat(str(tmp_path / "cut.mat"))
    broken = write_mat(str(tmp_path / "z.mat"), [double([[1.0]], name="x")], compress=True)
    data = bytearray(open(broken, "rb").read())
    data[-4:] = b"\xff\xff\xff\xff"  # damage the zlib checksum
    (tmp_path / "z.mat").write_bytes(bytes(data))
    with pytest.raises(MatFileError, match="compressed variable is corrupt"):
        read_mat(str(tmp_path / "z.mat"))
