"""The SyntheticReID renderer: image size, determinism for a seed, identities and cameras."""

import dataclasses

import numpy as np
from PIL import Image

from reid_engine.data.synthetic import TINY_SPEC, SyntheticWorld, color_sharing_groups, render_image
from reid_engine.data.synthetic.render import OUT_H, OUT_W


def _render(world, item, seed):
    rng = np.random.default_rng(seed)
    return render_image(world.identities[item.identity], world.cameras[item.camera], rng,
                        world.spec.occlusion_prob, world.spec.noise, world.spec.blur)


def test_render_is_a_128x64_rgb_image_fixed_by_the_rng_seed():
    world = SyntheticWorld(TINY_SPEC)
    item = world.plan[0]
    first = _render(world, item, 5)
    assert isinstance(first, Image.Image) and first.size == (OUT_W, OUT_H) == (64, 128)
    assert first.mode == "RGB"
    assert np.array_equal(np.asarray(first), np.asarray(_render(world, item, 5)))
    assert not np.array_equal(np.asarray(first), np.asarray(_render(world, item, 6)))


def test_world_render_is_deterministic():
    item = SyntheticWorld(TINY_SPEC).plan[3]
    a = SyntheticWorld(TINY_SPEC).render(item)
    b = SyntheticWorld(TINY_SPEC).render(item)
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_identities_share_colors_but_differ_otherwise():
    world = SyntheticWorld(TINY_SPEC)
    pids = range(1, TINY_SPEC.num_train_ids + TINY_SPEC.num_test_ids + 1)
    groups = color_sharing_groups(world, pids)
    assert sum(len(g) for g in groups.values()) >= 10  # many ids wear a color pair worn by others
    for group in groups.values():
        looks = {dataclasses.astuple(dataclasses.replace(world.identities[p - 1], upper=(0, 0, 0),
                                                         lower=(0, 0, 0)))
                 for p in group}
        assert len(looks) == len(group)  # same colors, yet no two identical people


def test_cameras_look_different():
    world = SyntheticWorld(TINY_SPEC)
    means = [cam.background.reshape(-1, 3).mean(0) * np.asarray(cam.gain)
             for cam in world.cameras]
    assert min(np.abs(a - b).sum() for i, a in enumerate(means) for b in means[i + 1:]) > 5


def test_another_seed_gives_other_images():
    a = SyntheticWorld(TINY_SPEC)
    b = SyntheticWorld(dataclasses.replace(TINY_SPEC, seed=1))
    item = a.plan[0]
    assert not np.array_equal(np.asarray(a.render(item)), np.asarray(b.render(item)))
