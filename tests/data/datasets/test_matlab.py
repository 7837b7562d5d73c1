"""Reading release .mat files: scipy for level-5 files, h5py for v7.3, one-line errors naming the file."""

import h5py
import numpy as np
import pytest
from scipy.io import savemat

from reid_engine.data.datasets.matlab import MatFileError, open_mat_v73, read_mat
from reid_engine.utils.errors import ReidUserError


def test_level5_variables_without_the_header(tmp_path):
    path = str(tmp_path / "x.mat")
    savemat(path, {"m": np.arange(6.0).reshape(2, 3)}, do_compression=True)
    data = read_mat(path)
    assert list(data) == ["m"]
    np.testing.assert_array_equal(data["m"], np.arange(6.0).reshape(2, 3))


def test_unreadable_files_are_one_line_errors_naming_them(tmp_path):
    v73 = str(tmp_path / "v73.mat")
    with h5py.File(v73, "w") as f:
        f["x"] = np.ones((2, 2))
    with pytest.raises(MatFileError, match=r"v73.mat' \(it is a MATLAB v7.3 \(HDF5\) file where a level-5"):
        read_mat(v73)
    good = str(tmp_path / "ok.mat")
    savemat(good, {"x": np.ones((40, 40))}, do_compression=True)
    cut = tmp_path / "cut.mat"
    cut.write_bytes(open(good, "rb").read()[:-20])
    with pytest.raises(ReidUserError) as err:
        read_mat(str(cut))
    assert "\n" not in str(err.value) and str(cut) in str(err.value)
    with pytest.raises(MatFileError, match=r"cannot read the MATLAB v7.3 file '.*ok.mat'"):
        open_mat_v73(good)
    with open_mat_v73(v73) as f:
        assert f["x"].shape == (2, 2)
