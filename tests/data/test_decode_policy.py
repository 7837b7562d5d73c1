"""Training may decode JPEGs at reduced scale; a test pipeline reads a training image cache only where
every cached image was decoded at full size (so cached and decoded test samples stay identical)."""
import numpy as np
import pytest
from PIL import Image

from reid_engine.config import get_cfg
from reid_engine.data import build_transforms, read_image
from reid_engine.data.common import decode_scale
from reid_engine.data.image_cache import ImageCache


def _jpegs(folder, height, width, count=3):
    rng = np.random.default_rng(height)
    paths = []
    for i in range(count):
        path = folder / f"{height}x{width}_{i}.jpg"
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path, quality=90)
        paths.append(str(path))
    return paths


def _pipelines():
    cfg = get_cfg()
    cfg.INPUT.SIZE_TRAIN = cfg.INPUT.SIZE_TEST = [24, 12]
    return build_transforms(cfg, is_train=True), build_transforms(cfg, is_train=False)


def test_read_image_records_a_reduced_scale_decode(tmp_path):
    small, large = _jpegs(tmp_path, 40, 20, 1)[0], _jpegs(tmp_path, 96, 48, 1)[0]
    assert decode_scale(read_image(large, (12, 24))) == 4 and read_image(large, (12, 24)).size == (12, 24)
    assert decode_scale(read_image(large)) == 1 and read_image(large).size == (48, 96)
    assert decode_scale(read_image(small, (12, 24))) == 1  # less than twice the size: nothing to skip


@pytest.mark.parametrize("height, width, serves", [(40, 20, True), (96, 48, False)], ids=["small", "large"])
def test_a_test_pipeline_reads_the_training_cache_only_where_it_holds_full_size_decodes(tmp_path, height, width,
                                                                                          serves):
    train, test = _pipelines()
    assert train.decode_size == (12, 24) and test.decode_size is None
    paths = _jpegs(tmp_path, height, width)
    cache = ImageCache(paths, train)
    assert not cache.serves(test)  # not filled yet: nothing is known of its decodes
    cache.fill(train, num_threads=1)
    assert cache.serves(train) and cache.serves(test) == serves
    if serves:  # what the test pipeline would decode itself
        for path in paths:
            np.testing.assert_array_equal(cache.lookup(path), test.prefix(read_image(path, test.decode_size)))
