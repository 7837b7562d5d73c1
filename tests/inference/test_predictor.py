"""DefaultPredictor: input forms, output shape / norm, batching, flip, checkpoint class count."""
import numpy as np
import pytest
import torch
from PIL import Image

from reid_engine.data import ImageReadError
from reid_engine.data.datasets import get_dataset
from reid_engine.inference import (
    PLACEHOLDER_NUM_CLASSES,
    as_pil_image,
    checkpoint_num_classes,
    inference_config,
)
from reid_engine.utils.errors import ReidUserError

from ._helpers import TINY_NUM_CLASSES, tiny_cfg


@pytest.fixture
def predictor(tiny_predictor):
    return tiny_predictor


@pytest.fixture(scope="module")
def query_paths(data_root):
    return [path for path, _, _ in get_dataset("SyntheticReIDTiny", data_root).query]


def test_shape_dtype_and_unit_norm(predictor, query_paths):
    features = predictor(query_paths[:5])
    assert features.shape == (5, 512)
    assert features.dtype == torch.float32 and features.device.type == "cpu"
    assert torch.allclose(features.norm(dim=1), torch.ones(5), atol=1e-5)
    one = predictor(query_paths[0])
    assert one.shape == (1, 512)
    # Different people give different embeddings (the model is not constant).
    assert not torch.allclose(features[0], features[1], atol=1e-3)


def test_path_pil_and_array_give_the_same_embedding(predictor, query_paths):
    path = query_paths[3]
    pil = Image.open(path)
    array = np.asarray(Image.open(path).convert("RGB"))
    features = predictor([path, pil, array])
    assert torch.equal(features[0], features[1])
    assert torch.equal(features[0], features[2])
    # A grey image is accepted and converted to RGB.
    grey = predictor(Image.open(path).convert("L"))
    assert grey.shape == (1, 512)


def test_batching_does_not_change_results(predictor, query_paths, monkeypatch):
    whole = predictor(query_paths[:5])
    monkeypatch.setattr(predictor, "batch_size", 2)  # 2 + 2 + 1
    torch.testing.assert_close(predictor(query_paths[:5]), whole, atol=1e-5, rtol=0)


def test_flip_averages_the_mirrored_image(predictor, query_paths, monkeypatch):
    assert predictor.flip is False  # TEST.FLIP.ENABLED defaults to off
    images = torch.stack([predictor.preprocess(p) for p in query_paths[:2]])
    with torch.no_grad():
        raw = predictor.model(images) + predictor.model(images.flip(dims=[3]))
    expected = torch.nn.functional.normalize(raw, dim=1)
    monkeypatch.setattr(predictor, "flip", True)
    torch.testing.assert_close(predictor(query_paths[:2]), expected, atol=1e-5, rtol=0)


def test_class_count_is_read_from_the_checkpoint(predictor, tiny_checkpoint, tmp_path):
    assert predictor.cfg.MODEL.HEADS.NUM_CLASSES == TINY_NUM_CLASSES
    assert predictor.cfg.MODEL.BACKBONE.PRETRAIN is False
    assert checkpoint_num_classes(tiny_checkpoint) == TINY_NUM_CLASSES
    # A bare state dict with DDP prefixes is understood too; one without a classifier is not.
    torch.save({"module.heads.weight": torch.zeros(7, 4)}, tmp_path / "ddp.pth")
    assert checkpoint_num_classes(str(tmp_path / "ddp.pth")) == 7
    torch.save({"backbone.conv1.weight": torch.zeros(2, 3, 1, 1)}, tmp_path / "no_head.pth")
    assert checkpoint_num_classes(str(tmp_path / "no_head.pth")) is None


def test_placeholder_class_count_without_weights(data_root):
    cfg = inference_config(tiny_cfg(data_root))
    assert cfg.MODEL.HEADS.NUM_CLASSES == PLACEHOLDER_NUM_CLASSES


def test_bad_inputs_give_clear_errors(predictor, tmp_path):
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        as_pil_image(np.zeros((8, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        as_pil_image(np.zeros((8, 4, 3), dtype=np.float32))
    with pytest.raises(TypeError, match="file path, a PIL image"):
        as_pil_image(42)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    with pytest.raises(ImageReadError, match="broken.jpg"):
        predictor(str(broken))
    with pytest.raises(ValueError, match="no image given"):
        predictor([])
    with pytest.raises(ReidUserError, match="uint8"):  # a user error: one line at the command line
        as_pil_image(np.zeros((8, 4, 3), dtype=np.float32))
