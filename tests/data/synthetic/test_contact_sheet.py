"""The contact sheet: a PNG grid of test identities by camera."""

import dataclasses

import numpy as np
from PIL import Image

from reid_engine.data.synthetic import TINY_SPEC, write_contact_sheet


def test_contact_sheet(tmp_path):
    path = write_contact_sheet(str(tmp_path / "sheet.png"), TINY_SPEC, num_ids=4, zoom=1)
    assert path == str(tmp_path / "sheet.png")
    with Image.open(path) as img:
        # 4 rows of 128 px (+2 px gaps, 14 px header); 3 camera columns of 64 px after a label.
        assert img.size == (34 + 3 * 66, 14 + 4 * 130)
        assert np.asarray(img.convert("RGB")).std() > 10  # people were drawn, not a blank page


def test_contact_sheet_zoom_and_new_folder(tmp_path):
    spec = dataclasses.replace(TINY_SPEC, num_cameras=2, cams_per_id=(2, 2))
    path = write_contact_sheet(str(tmp_path / "new" / "sheet.png"), spec, num_ids=2, zoom=2)
    with Image.open(path) as img:
        assert img.size == (2 * (34 + 2 * 66), 2 * (14 + 2 * 130))
