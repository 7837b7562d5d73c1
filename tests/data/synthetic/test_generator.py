"""The SyntheticReID generator: determinism, layout, counts, plan rules and atomic creation.

Only the tiny variant is generated here (~270 images, well under a second).
"""

import dataclasses
import filecmp
import os
import re

import numpy as np
import pytest
from PIL import Image

from reid_engine.data.datasets import DatasetFormatError, get_dataset
from reid_engine.data.synthetic import (
    MARKER,
    SPLIT_DIRS,
    TINY_SPEC,
    SyntheticWorld,
    ensure_synthetic_reid,
    generate_synthetic_reid,
    generator,
    read_marker,
)

NAME = re.compile(r"^(\d{4})_c(\d)s1_(\d{6})_00\.jpg$")


@pytest.fixture
def tiny_root(data_root):
    """The session data root of tests/conftest.py, where SyntheticReIDTiny was generated."""
    return data_root


def all_files(folder):
    """Relative paths of every file under ``folder``, sorted."""
    return sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, files in os.walk(folder) for f in files)


@pytest.mark.slow
def test_tiny_layout_names_and_counts(tiny_root):
    folder = os.path.join(tiny_root, "SyntheticReIDTiny")
    world = SyntheticWorld(TINY_SPEC)
    counts = read_marker(folder)["counts"]
    assert counts == world.counts()
    for split, sub in SPLIT_DIRS.items():
        names = os.listdir(os.path.join(folder, sub))
        assert len(names) == counts[split]["images"]
        assert all(NAME.match(n) for n in names), names[:3]
    ds = get_dataset("SyntheticReIDTiny", tiny_root)
    assert ds.num_train_pids == 24 and ds.num_train_cams == 3
    assert {p for _, p, _ in ds.query} == set(range(25, 41))  # every test id has a query
    assert {p for _, p, _ in ds.gallery} == set(range(25, 41)) | {0}  # plus distractors
    assert sum(p == 0 for _, p, _ in ds.gallery) == TINY_SPEC.num_distractors
    assert 200 <= len(ds.train) + len(ds.query) + len(ds.gallery) <= 400
    # One query per (id, camera); every query has a gallery image of its id in another camera.
    assert len({(p, c) for _, p, c in ds.query}) == len(ds.query)
    gallery_cams = {}
    for _, p, c in ds.gallery:
        gallery_cams.setdefault(p, set()).add(c)
    assert all(gallery_cams[p] - {c} for _, p, c in ds.query)


def test_images_are_128x64_rgb_and_not_blank(tiny_root):
    folder = os.path.join(tiny_root, "SyntheticReIDTiny", "query")
    for name in sorted(os.listdir(folder))[:10]:
        with Image.open(os.path.join(folder, name)) as img:
            assert img.size == (64, 128) and img.mode == "RGB"
            assert np.asarray(img).std() > 10


@pytest.mark.slow
def test_same_seed_gives_byte_identical_files(tiny_root, tmp_path):
    generate_synthetic_reid(str(tmp_path / "again"), TINY_SPEC)
    first = os.path.join(tiny_root, "SyntheticReIDTiny")
    files = all_files(first)
    assert files == all_files(str(tmp_path / "again"))
    match, mismatch, errors = filecmp.cmpfiles(first, str(tmp_path / "again"), files,
                                               shallow=False)
    assert not mismatch and not errors and len(match) == len(files)


def test_plan_follows_the_camera_and_image_count_rules():
    spec = TINY_SPEC
    world = SyntheticWorld(spec)
    by_pid = {}
    for item in world.plan:
        by_pid.setdefault(item.pid, []).append(item)
        assert 0 <= item.camera < spec.num_cameras
    assert sorted(by_pid) == list(range(0, spec.num_train_ids + spec.num_test_ids + 1))
    for pid, items in by_pid.items():
        if pid == 0:
            continue
        cams = {}
        for item in items:
            cams[item.camera] = cams.get(item.camera, 0) + 1
        assert spec.cams_per_id[0] <= len(cams) <= spec.cams_per_id[1], pid
        assert all(spec.images_per_cam[0] <= n <= spec.images_per_cam[1] for n in cams.values()), pid
        splits = {item.split for item in items}
        assert splits == ({"train"} if pid <= spec.num_train_ids else {"query", "gallery"}), pid
    # file names are unique: the frame counter runs per camera
    assert len({item.rel_path for item in world.plan}) == len(world.plan)


def test_distractors_are_pid_0_gallery_images_of_people_outside_both_splits():
    spec = TINY_SPEC
    world = SyntheticWorld(spec)
    distractors = [item for item in world.plan if item.pid == 0]
    assert len(distractors) == spec.num_distractors
    assert all(item.split == "gallery" for item in distractors)
    first = spec.num_train_ids + spec.num_test_ids
    assert sorted(item.identity for item in distractors) == list(range(first, first + spec.num_distractors))
    assert all(NAME.match(item.file_name).group(1) == "0000" for item in distractors)


def test_file_names_are_market_style():
    item = generator.PlannedImage("query", 27, 26, 2, 15)
    assert item.file_name == "0027_c3s1_000015_00.jpg" and NAME.match(item.file_name)
    assert item.rel_path == os.path.join("query", item.file_name)
    assert generator.PlannedImage("gallery", 3, 2, 0, 1).rel_path.startswith("bounding_box_test")


def test_second_construction_reuses_the_folder(tiny_root, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("must not regenerate")

    monkeypatch.setattr(generator, "generate_synthetic_reid", fail)
    assert ensure_synthetic_reid(tiny_root, "SyntheticReIDTiny", TINY_SPEC).endswith("Tiny")


def test_losing_the_race_discards_our_copy(tmp_path, monkeypatch):
    real = generator.generate_synthetic_reid
    final = str(tmp_path / "SyntheticReIDTiny")
    small = dataclasses.replace(TINY_SPEC, num_train_ids=3, num_test_ids=2, num_distractors=1)

    def generate_while_another_process_wins(out_dir, spec, **kwargs):
        info = real(out_dir, spec)
        real(final, spec)  # the other process renames its complete copy into place first
        open(os.path.join(final, "winner"), "w").close()
        return info

    monkeypatch.setattr(generator, "generate_synthetic_reid",
                        generate_while_another_process_wins)
    assert ensure_synthetic_reid(str(tmp_path), "SyntheticReIDTiny", small) == final
    assert os.path.isfile(os.path.join(final, "winner"))  # theirs kept
    assert os.listdir(str(tmp_path)) == ["SyntheticReIDTiny"]  # ours removed


def test_interrupted_generation_leaves_nothing(tmp_path, monkeypatch):
    def crash(out_dir, spec, **kwargs):
        open(os.path.join(out_dir, "partial.jpg"), "w").close()
        raise KeyboardInterrupt

    monkeypatch.setattr(generator, "generate_synthetic_reid", crash)
    with pytest.raises(KeyboardInterrupt):
        ensure_synthetic_reid(str(tmp_path), "SyntheticReIDTiny", TINY_SPEC)
    assert os.listdir(str(tmp_path)) == []


def test_incomplete_folder_is_a_clear_error(tmp_path):
    os.makedirs(str(tmp_path / "SyntheticReIDTiny" / "query"))
    with pytest.raises(DatasetFormatError, match=f"no '{MARKER}' marker.*delete it"):
        get_dataset("SyntheticReIDTiny", str(tmp_path))


def test_spec_validation():
    with pytest.raises(ValueError, match="cams_per_id"):
        SyntheticWorld(dataclasses.replace(TINY_SPEC, cams_per_id=(1, 2)))
    with pytest.raises(ValueError, match="cams_per_id"):
        SyntheticWorld(dataclasses.replace(TINY_SPEC, cams_per_id=(2, 4)))  # only 3 cameras


def test_make_synthetic_tool(tmp_path):
    import runpy

    tool = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools",
                                       "make_synthetic.py"))
    status = tool["main"](["--root", str(tmp_path), "--tiny", "--train-ids", "4", "--test-ids",
                           "3", "--distractors", "2", "--contact-sheet",
                           str(tmp_path / "s.png"), "--sheet-ids", "2"])
    assert status == 0
    ds = get_dataset("SyntheticReIDTiny", str(tmp_path))
    assert ds.num_train_pids == 4 and len({p for _, p, _ in ds.query}) == 3
    assert os.path.isfile(str(tmp_path / "s.png"))


def test_force_replaces_an_existing_folder(tmp_path):
    small = dataclasses.replace(TINY_SPEC, num_train_ids=2, num_test_ids=2, num_distractors=1)
    os.makedirs(str(tmp_path / "SyntheticReIDTiny" / "stale"))
    final = ensure_synthetic_reid(str(tmp_path), "SyntheticReIDTiny", small, force=True)
    assert read_marker(final)["spec"]["num_train_ids"] == 2
    assert not os.path.exists(os.path.join(final, "stale"))
    assert os.listdir(str(tmp_path)) == ["SyntheticReIDTiny"]
