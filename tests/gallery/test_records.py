"""Item metadata: list files (aliases, relative paths, unknown values, bad columns) and tracklet items."""
import numpy as np
import pytest

from reid_engine.gallery import QueryInputError, read_list_file, records_from_items
from reid_engine.utils.errors import UsageError


def test_list_file_columns_aliases_and_relative_paths(tmp_path):
    (tmp_path / "crops.csv").write_text("path,camera,frame,trackid\na.jpg,2,150,7\nsub/b.jpg,3,,8\n")
    records = read_list_file(str(tmp_path / "crops.csv"))
    assert list(records.path) == [str(tmp_path / "a.jpg"), str(tmp_path / "sub" / "b.jpg")]
    np.testing.assert_array_equal(records.camid, [2, 3])
    np.testing.assert_array_equal(records.time, [150.0, -1.0])  # an empty cell is unknown
    np.testing.assert_array_equal(records.trackid, [7, 8])
    assert records.present_fields() == ["path", "camid", "time", "trackid"]  # no pid column: no pid field


def test_list_file_errors(tmp_path):
    with pytest.raises(QueryInputError, match="does not exist"):
        read_list_file(str(tmp_path / "none.csv"))
    (tmp_path / "nopath.csv").write_text("file,camid\na.jpg,1\n")
    with pytest.raises(QueryInputError, match="no 'path' column"):
        read_list_file(str(tmp_path / "nopath.csv"))
    (tmp_path / "zone.csv").write_text("path,zone\na.jpg,1\n")
    with pytest.raises(UsageError, match="unknown column 'zone'"):
        read_list_file(str(tmp_path / "zone.csv"))
    (tmp_path / "nan.csv").write_text("path,time\na.jpg,noon\n")
    with pytest.raises(QueryInputError, match="not a number"):
        read_list_file(str(tmp_path / "nan.csv"))


def test_tracklets_keep_their_first_frame_and_a_track_id():
    items = [(("t0/f1.jpg", "t0/f2.jpg"), 4, 1), (("t1/f1.jpg",), 5, 2)]
    records = records_from_items(items)
    assert list(records.path) == ["t0/f1.jpg", "t1/f1.jpg"]
    np.testing.assert_array_equal(records.trackid, [0, 1])
    np.testing.assert_array_equal(records.pid, [4, 5])
