"""Tests of reid_engine.data.transforms: each op's effect, determinism and the builder."""

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance

from reid_engine.config import get_cfg
from reid_engine.data.transforms import (
    AugMix,
    AutoAugment,
    CenterCrop,
    ColorJitter,
    RandomAffine,
    RandomErasing,
    RandomHorizontalFlip,
    RandomPadCrop,
    RandomPatch,
    RandomResizedCrop,
    Resize,
    build_transforms,
    to_tensor,
)


def _array(h=32, w=16, seed=0, low=0, high=256):
    return np.random.default_rng(seed).integers(low, high, (h, w, 3), dtype=np.uint8)


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_flip_mirrors_columns_exactly():
    arr = _array()
    out = RandomHorizontalFlip(p=1.0)(arr, _rng())
    assert np.array_equal(out, arr[:, ::-1])
    assert np.array_equal(out[:, 0], arr[:, -1])
    assert RandomHorizontalFlip(p=0.0)(arr, _rng()) is arr


def test_resize_is_bicubic_to_height_width():
    img = Image.fromarray(_array(20, 10))
    out = Resize((32, 16))(img)
    assert out.size == (16, 32)
    assert np.array_equal(np.asarray(out), np.asarray(img.resize((16, 32), Image.BICUBIC)))


def test_pad_crop_keeps_size_and_shifts_content():
    arr, pad = _array(), 3
    op = RandomPadCrop(pad)
    for seed in range(20):
        top, left, h, w = op.get_params(arr.shape[:2], _rng(seed))
        out = op(arr, _rng(seed))
        assert out.shape == arr.shape
        expected = np.pad(arr, ((pad, pad), (pad, pad), (0, 0)))[top:top + h, left:left + w]
        assert np.array_equal(out, expected)
    # Some draw shifted the content (the crop window is not always centred).
    assert any(op.get_params(arr.shape[:2], _rng(s))[:2] != (pad, pad) for s in range(20))


def test_pad_crop_edge_mode_and_bad_mode():
    arr = _array()
    top, left, h, w = RandomPadCrop(2, mode="edge").get_params(arr.shape[:2], _rng(1))
    out = RandomPadCrop(2, mode="edge")(arr, _rng(1))
    assert np.array_equal(out, np.pad(arr, ((2, 2), (2, 2), (0, 0)), mode="edge")[
        top:top + h, left:left + w])
    with pytest.raises(ValueError, match="INPUT.PADDING.MODE"):
        RandomPadCrop(2, mode="bogus")


def test_random_resized_crop_output_size_and_full_crop():
    img = Image.fromarray(_array(40, 20))
    out = RandomResizedCrop((24, 12))(img, _rng())
    assert out.size == (12, 24)
    # Whole-image area at the image's own ratio: the crop is the image, so it equals a resize.
    full = RandomResizedCrop((24, 12), scale=(1, 1), ratio=(0.5, 0.5))(img, _rng())
    assert np.array_equal(np.asarray(full), np.asarray(img.resize((12, 24), Image.BICUBIC)))


def test_center_crop_takes_the_middle():
    arr = _array(10, 8)
    assert np.array_equal(CenterCrop((6, 4))(arr), arr[2:8, 2:6])
    assert CenterCrop((12, 8))(arr).shape == (12, 8, 3)  # smaller input is zero-padded


def test_color_jitter_changes_values_not_geometry():
    img = Image.fromarray(_array())
    out = ColorJitter(0.4, 0.4, 0.4, 0.1)(img, _rng(3))
    assert out.size == img.size and out.mode == "RGB"
    assert not np.array_equal(np.asarray(out), np.asarray(img))
    # Brightness alone scales every pixel by the drawn factor.
    op = ColorJitter(brightness=0.5)
    (_, factor), = op.get_params(_rng(5))
    got = np.asarray(op(img, _rng(5)), dtype=np.int32)
    expected = np.asarray(ImageEnhance.Brightness(img).enhance(factor), dtype=np.int32)
    assert np.array_equal(got, expected) and factor != 1.0
    # A grey image has no hue: a hue shift leaves it alone.
    grey = Image.new("RGB", (8, 8), (90, 90, 90))
    assert np.array_equal(np.asarray(ColorJitter(hue=0.5)(grey, _rng(1))), np.asarray(grey))


def test_affine_rotation_and_translation_are_exact():
    square = Image.fromarray(_array(16, 16))
    op = RandomAffine()
    rotated = op.apply(square, 90.0, (0, 0), 1.0, (0.0, 0.0))
    assert np.array_equal(np.asarray(rotated), np.rot90(np.asarray(square)))  # counter-clockwise
    shifted = np.asarray(op.apply(square, 0.0, (3, 2), 1.0, (0.0, 0.0)))
    assert np.array_equal(shifted[2:, 3:], np.asarray(square)[:-2, :-3])
    assert not shifted[:2].any() and not shifted[:, :3].any()  # uncovered pixels are black
    out = op(square, _rng(0))
    assert out.size == square.size and not np.array_equal(np.asarray(out), np.asarray(square))


def test_autoaugment_keeps_shape_and_changes_image():
    img = Image.fromarray(_array())
    inverted = AutoAugment([(("Invert", 1.0, 0),)])(img, _rng())
    assert np.array_equal(np.asarray(inverted), 255 - np.asarray(img))
    outs = [np.asarray(AutoAugment()(img, _rng(s))) for s in range(10)]
    assert all(o.shape == (32, 16, 3) and o.dtype == np.uint8 for o in outs)
    assert any(not np.array_equal(o, np.asarray(img)) for o in outs)
    with pytest.raises(ValueError, match="unknown op"):
        AutoAugment([(("Nope", 1.0, 3),)])


def test_augmix_keeps_shape_and_changes_image():
    img = Image.fromarray(_array())
    out = AugMix()(img, _rng(2))
    assert out.shape == (32, 16, 3) and out.dtype == np.uint8
    assert not np.array_equal(out, np.asarray(img))
    assert np.array_equal(out, AugMix()(img, _rng(2)))


def test_random_erasing_fills_one_rectangle_within_area_range():
    value, scale = (200.0, 100.0, 50.0), (0.05, 0.3)
    op = RandomErasing(p=1.0, scale=scale, value=value)
    for seed in range(25):
        src = torch.from_numpy(_array(32, 16, seed, high=40).transpose(2, 0, 1).copy())
        out = op(src.clone(), _rng(seed))
        changed = (out != src).any(0)
        ys, xs = np.nonzero(changed.numpy())
        assert len(ys) > 0
        box = out[:, ys.min():ys.max() + 1, xs.min():xs.max() + 1]
        assert changed.sum() == box.shape[1] * box.shape[2]  # one solid rectangle
        assert (box == torch.tensor([200, 100, 50], dtype=torch.uint8).view(3, 1, 1)).all()
        assert scale[0] <= box.shape[1] * box.shape[2] / (32 * 16) <= scale[1]
    src = torch.zeros(3, 8, 8, dtype=torch.uint8)
    assert torch.equal(RandomErasing(p=0.0)(src.clone(), _rng()), src)


def test_random_erasing_defaults_are_fastreids_and_config_reaches_them():
    assert (RandomErasing().scale, RandomErasing().ratio) == ((0.02, 0.33), (0.3, 3.3))
    op = RandomErasing(p=1.0)
    # draws cover fast-reid's ranges: area fraction in [0.02, 0.33], ratio in [0.3, 3.3], log-uniform
    areas, ratios = [], []
    for seed in range(400):
        h, w = op.get_params(256, 128, _rng(seed))[2:]
        areas.append(h * w / (256 * 128))
        ratios.append(h / w)
    assert 0.02 <= min(areas) and max(areas) <= 0.33 and max(areas) > 0.3
    assert min(ratios) >= 0.3 * 0.9 and max(ratios) <= 3.3 * 1.1
    assert abs(np.median(np.log(ratios))) < 0.25  # log-uniform around ratio 1
    cfg = get_cfg()
    cfg.INPUT.REA.ENABLED = True
    cfg.INPUT.REA.SCALE = [0.1, 0.2]
    cfg.INPUT.REA.RATIO = [0.5, 2.0]
    erasing = [t for t in build_transforms(cfg, is_train=True).sample_ops if isinstance(t, RandomErasing)]
    assert len(erasing) == 1 and erasing[0].scale == (0.1, 0.2) and erasing[0].ratio == (0.5, 2.0)
    with pytest.raises(ValueError, match="INPUT.REA.RATIO"):
        RandomErasing(ratio=(2.0, 1.0))
    with pytest.raises(ValueError, match="INPUT.REA.SCALE"):
        RandomErasing(scale=(0.3, 0.1))


def test_random_patch_pastes_a_patch_of_another_image():
    images = torch.stack([to_tensor(_array(16, 8, s)) for s in range(2)])
    out = RandomPatch(p=1.0, area=(0.1, 0.3), min_ratio=0.5)(images, _rng(4))
    assert torch.equal(images, torch.stack([to_tensor(_array(16, 8, s)) for s in range(2)]))
    for dst, src in ((0, 1), (1, 0)):
        changed = (out[dst] != images[dst]).any(0).numpy()
        ys, xs = np.nonzero(changed)
        assert len(ys) > 0
        patch = out[dst, :, ys.min():ys.max() + 1, xs.min():xs.max() + 1]
        h, w = patch.shape[1:]
        windows = [images[src, :, y:y + h, x:x + w] for y in range(16 - h + 1)
                   for x in range(8 - w + 1)]
        assert any(torch.equal(patch, win) or torch.equal(patch, win.flip(-1)) for win in windows)
    single = images[:1]
    assert torch.equal(RandomPatch(p=1.0)(single, _rng()), single)  # no other image to use


def _all_augs_cfg():
    cfg = get_cfg()
    cfg.INPUT.SIZE_TRAIN = [32, 16]
    cfg.INPUT.SIZE_TEST = [32, 16]
    for key in ("FLIP", "PADDING", "CJ", "AFFINE", "REA", "RPT"):
        cfg.INPUT[key].ENABLED = True
    cfg.INPUT.PADDING.SIZE = 2
    cfg.INPUT.AUTOAUG.ENABLED, cfg.INPUT.AUTOAUG.PROB = True, 0.5
    cfg.INPUT.AUGMIX.ENABLED, cfg.INPUT.AUGMIX.PROB = True, 0.5
    return cfg


def test_train_pipeline_is_deterministic_per_seed():
    pipeline = build_transforms(_all_augs_cfg(), is_train=True)
    img = Image.fromarray(_array(40, 20))
    a, b, c = (pipeline(img, _rng(s)) for s in (7, 7, 8))
    assert a.shape == (3, 32, 16) and a.dtype == torch.uint8 and a.is_contiguous()
    assert torch.equal(a, b) and not torch.equal(a, c)
    batch = torch.stack([a, c])
    assert torch.equal(pipeline.apply_batch(batch, _rng(1)), pipeline.apply_batch(batch, _rng(1)))
    with pytest.raises(ValueError, match="numpy.random.Generator"):
        pipeline(img)


def test_builder_orders_ops_and_builds_test_pipeline():
    cfg = get_cfg()
    for key in ("FLIP", "PADDING", "REA"):
        cfg.INPUT[key].ENABLED = True
    train = build_transforms(cfg, is_train=True)
    assert [type(op).__name__ for op in train.sample_ops] == [
        "Resize", "RandomPadCrop", "RandomHorizontalFlip", "RandomErasing"]
    assert train.batch_ops == [] and train.decode_size == (128, 256)
    cfg.INPUT.CROP.ENABLED = True
    cfg.INPUT.CROP.SIZE = [224, 112]
    test = build_transforms(cfg, is_train=False)
    assert [type(op).__name__ for op in test.sample_ops] == ["Resize", "CenterCrop"]
    out = test(Image.fromarray(_array(128, 64)))
    assert out.shape == (3, 224, 112) and out.dtype == torch.uint8
    cfg.INPUT.SIZE_TRAIN = [256]
    with pytest.raises(ValueError, match="INPUT.SIZE_TRAIN"):
        build_transforms(cfg, is_train=True)
