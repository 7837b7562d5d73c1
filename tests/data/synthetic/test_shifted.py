"""SyntheticReIDShifted: SyntheticReID left untouched, the shift is real, the set deterministic."""

import dataclasses
import hashlib
import os

import numpy as np
import pytest

from reid_engine.data.datasets import get_dataset
from reid_engine.data.synthetic import (
    DEFAULT_SPEC,
    SHIFTED_SPEC,
    SHIFTED_TINY_SPEC,
    SyntheticSpec,
    SyntheticWorld,
    read_marker,
)
from reid_engine.data.synthetic.render import CLOTH_COLORS, SHIFTED_CLOTH_COLORS

# SyntheticReID as generated before the spec grew its shift fields (computed on main).
DEFAULT_PLAN_SHA = "3be90a34242b015f67bdb4f0e47c1e7425d63f33c7518db32c3f8db47564a290"
DEFAULT_IDENTITIES_SHA = "5adbf0407b0363922ebd273564c79e98317d12ed22ec817de72e178e6e8ad31a"
DEFAULT_IMAGE_SHA = {0: "913298ac17c11639c05361f68b8b63689f581282d994de613861c4d4918f22b2",
                     7523: "7da73ad3d30f5259c54e2d613337b6d4600d6734b575eae0d4924fdc0f4688d9"}
DEFAULT_FIELDS = dict(num_train_ids=300, num_test_ids=300, num_cameras=6, cams_per_id=(2, 5), images_per_cam=(2, 5),
                      num_distractors=100, palette_size=24, occlusion_prob=0.15, noise=6.0, cast_strength=0.15,
                      blur=1.0, seed=0, jpeg_quality=90)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_synthetic_reid_is_byte_identical_to_before_the_shift_fields():
    assert {k: getattr(DEFAULT_SPEC, k) for k in DEFAULT_FIELDS} == DEFAULT_FIELDS
    world = SyntheticWorld(DEFAULT_SPEC)
    assert _sha(repr(world.plan).encode()) == DEFAULT_PLAN_SHA
    assert _sha(repr(world.identities).encode()) == DEFAULT_IDENTITIES_SHA
    for index, sha in DEFAULT_IMAGE_SHA.items():
        assert _sha(np.asarray(world.render(world.plan[index])).tobytes()) == sha


def _small(spec):
    """The spec's world with fewer people (identity k and the cameras are drawn the same)."""
    return SyntheticWorld(dataclasses.replace(spec, num_train_ids=40, num_test_ids=40, num_distractors=0))


def test_shifted_world_changes_people_palette_cameras_and_light():
    base, shifted = _small(DEFAULT_SPEC), _small(SHIFTED_SPEC)
    assert len(shifted.cameras) == 8 != len(base.cameras)
    # Other identities, dressed from a palette that shares no color with SyntheticReID's.
    assert not set(CLOTH_COLORS) & set(SHIFTED_CLOTH_COLORS)
    base_people = {dataclasses.astuple(i) for i in base.identities}
    assert not base_people & {dataclasses.astuple(i) for i in shifted.identities}
    assert all(i.cap in SHIFTED_CLOTH_COLORS and i.bag_color in SHIFTED_CLOTH_COLORS for i in shifted.identities)
    # Darker, warm-cast light; people face the camera more often and look smaller.
    assert np.mean([np.mean(c.gain) for c in shifted.cameras]) < np.mean([np.mean(c.gain) for c in base.cameras])
    assert all(c.gain[0] > c.gain[2] for c in shifted.cameras)
    assert min(c.front_prob for c in shifted.cameras) >= 0.6 > min(c.front_prob for c in base.cameras)
    assert max(c.scale for c in shifted.cameras) <= 0.95 < max(c.scale for c in base.cameras)
    # Darker scenes.
    assert np.mean([c.background.mean() for c in shifted.cameras]) < np.mean([c.background.mean() for c in base.cameras])
    # Same sizes as SyntheticReID.
    assert (SHIFTED_SPEC.num_train_ids, SHIFTED_SPEC.num_test_ids) == (DEFAULT_SPEC.num_train_ids, DEFAULT_SPEC.num_test_ids)


@pytest.mark.slow
def test_shifted_tiny_is_generated_deterministically(tmp_path):
    ds = get_dataset("SyntheticReIDShiftedTiny", str(tmp_path))
    folder = os.path.join(str(tmp_path), "SyntheticReIDShiftedTiny")
    marker = read_marker(folder)
    assert marker["spec"]["cloth_palette"] == "shifted" and marker["spec"]["seed"] == SHIFTED_TINY_SPEC.seed
    # The marker's spec rebuilds the same world (what tools/benchmarks/synthetic_difficulty.py does).
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in marker["spec"].items()}
    assert SyntheticSpec(**fields) == SHIFTED_TINY_SPEC
    assert marker["counts"] == SyntheticWorld(SHIFTED_TINY_SPEC).counts()
    assert ds.num_train_pids == 24 and ds.num_train_cams == 4
    world = SyntheticWorld(SHIFTED_TINY_SPEC)
    item = world.plan[5]
    written = np.asarray(world.render(item))
    assert np.array_equal(written, np.asarray(SyntheticWorld(SHIFTED_TINY_SPEC).render(item)))


def test_shifted_catalog_names_and_spec_validation():
    from reid_engine.data.datasets import DATASET_REGISTRY

    for name in ("SyntheticReIDShifted", "SyntheticReIDShiftedTiny"):
        assert DATASET_REGISTRY.get(name).FOLDER == name
    assert "SyntheticReIDShifted" in DATASET_REGISTRY.get("SyntheticReIDShifted").__doc__
    with pytest.raises(ValueError, match="cloth_palette"):
        dataclasses.replace(SHIFTED_SPEC, cloth_palette="neon").validate()
    with pytest.raises(ValueError, match="brightness"):
        dataclasses.replace(SHIFTED_SPEC, brightness=(0.9, 0.5)).validate()
