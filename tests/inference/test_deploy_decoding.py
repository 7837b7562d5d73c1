"""Evaluation sees what deployment sees: an outside ONNX Runtime client equals reid-extract on large JPEGs.

The client knows nothing of reid_engine: it reads the ONNX file's metadata_props and uses
onnxruntime, Pillow and numpy only. reid-extract embeds the same files through the test
loader (the evaluation's), which must decode them as the client does: at full size.
"""
import os

import numpy as np
import pytest
from PIL import Image

from reid_engine import export
from reid_engine.cli import extract as extract_cli
from reid_engine.data import build_transforms, read_image
from reid_engine.data.common import decode_scale
from reid_engine.inference import load_features
from tests.inference._helpers import tiny_cfg

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")  # reid-export writes the contract with it

INPUT = (64, 32)  # the tiny config's INPUT.SIZE_TEST (height, width)
SCALES = (1, 2, 4)
#: resize to 72x36, then center-crop to the input size
CROP = {"INPUT.SIZE_TEST": [72, 36], "INPUT.CROP.ENABLED": True, "INPUT.CROP.SIZE": list(INPUT)}


def outside_client_features(onnx_path, image_paths):
    """Features as a deployment client computes them from the file's metadata alone."""
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    resize = (int(meta["resize_width"]), int(meta["resize_height"]))
    out_h, out_w = int(meta["input_height"]), int(meta["input_width"])
    batch = []
    for path in image_paths:
        image = Image.open(path).convert("RGB")  # a full decode, as any client does
        image = image.resize(resize, getattr(Image.Resampling, meta["interpolation"].upper()))
        array = np.asarray(image, dtype=np.float32)
        top, left = int(round((array.shape[0] - out_h) / 2)), int(round((array.shape[1] - out_w) / 2))
        array = array[top:top + out_h, left:left + out_w]
        if meta["channel_order"] == "BGR":
            array = array[..., ::-1]
        if meta["value_range"] == "0..1":
            array = array / 255.0
        if meta["normalization"] == "outside":
            mean = np.array([float(v) for v in meta["pixel_mean"].split(",")], dtype=np.float32)
            std = np.array([float(v) for v in meta["pixel_std"].split(",")], dtype=np.float32)
            array = (array - mean) / std
        batch.append(array.transpose(2, 0, 1))
    images = np.stack(batch).astype(meta["input_dtype"])
    return session.run([meta["output_name"]], {meta["input_name"]: images})[0]


@pytest.fixture(scope="module")
def large_jpegs(tmp_path_factory):
    """A folder of JPEGs at 1x, 2x and 4x the input size (and a 4x one of odd size): {scale: [paths]}."""
    folder = tmp_path_factory.mktemp("large_jpegs")
    rng = np.random.default_rng(0)
    paths = {}
    sizes = [(scale, INPUT[0] * scale, INPUT[1] * scale) for scale in SCALES] + [(4, 4 * INPUT[0] + 13, 4 * INPUT[1] + 5)]
    for scale, height, width in sizes:
        for i in range(3):
            # smooth structure (upsampled noise) plus fine texture: what draft decoding changes
            coarse = Image.fromarray(rng.integers(0, 256, (8, 4, 3), dtype=np.uint8)).resize((width, height),
                                                                                               Image.BICUBIC)
            pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-40, 41, (height, width, 3))
            path = folder / f"x{scale}_{height}x{width}_{i}.jpg"
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=92)
            paths.setdefault(scale, []).append(str(path))
    return paths


def test_only_training_pipelines_decode_at_reduced_scale(data_root, large_jpegs):
    cfg = tiny_cfg(data_root)
    assert build_transforms(cfg, is_train=False).decode_size is None
    train = build_transforms(cfg, is_train=True)
    assert train.decode_size == (128, 256)  # INPUT.SIZE_TRAIN as (width, height)
    # the 4x images are where draft decoding would have given other pixels
    draft = (INPUT[1], INPUT[0])
    assert decode_scale(read_image(large_jpegs[4][0], draft)) == 4 and decode_scale(read_image(large_jpegs[4][0])) == 1


@pytest.mark.slow
@pytest.mark.parametrize("crop", [False, True], ids=["resize", "resize+crop"])
def test_outside_client_equals_reid_extract_on_large_jpegs(crop, data_root, tiny_checkpoint, tiny_config_file,
                                                           tiny_predictor, large_jpegs, tmp_path):
    overrides = CROP if crop else {}
    cfg = tiny_cfg(data_root, tiny_checkpoint, extra=[x for key, value in overrides.items() for x in (key, value)])
    opts = [x for key, value in overrides.items() for x in (key, str(value))]  # as typed on the command line
    onnx_path = export.export_model(cfg, str(tmp_path / "exported"), formats=("onnx",),
                                    model=tiny_predictor.model)["onnx"]["path"]
    out = str(tmp_path / "features.npz")
    folder = os.path.dirname(large_jpegs[1][0])
    assert extract_cli.main(["--config-file", tiny_config_file, "--image-dir", folder, "--output", out] + opts) == 0
    extracted = load_features(out)
    rows = {os.path.basename(p): i for i, p in enumerate(extracted["paths"])}
    for scale, paths in large_jpegs.items():
        client = outside_client_features(onnx_path, paths)
        ours = extracted["features"][[rows[os.path.basename(p)] for p in paths]]
        assert client.shape == ours.shape == (len(paths), 512)
        difference = float(np.abs(client - ours).max())
        assert difference <= 1e-5, f"{scale}x the input size: max |client - reid-extract| = {difference:.3g}"
