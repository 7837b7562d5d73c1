"""Every backbone family and meta architecture exports to ONNX (fp32, checked against PyTorch) and
quantizes to int8 (static QDQ, calibrated on real images), or fails with a one-line reason.

The cheapest member of each family, at a tiny input size (ResNeXt, ResNeSt and ViT: one
block per stage of their own blocks, or a 2-layer ViT); the slower half is marked slow.
"""
import numpy as np
import pytest
import torch

from reid_engine import export
from reid_engine.config import get_cfg
from reid_engine.data.datasets import get_dataset
from reid_engine.inference import OnnxRuntimeModel, contract_config
from reid_engine.modeling import build_model
from reid_engine.modeling.backbones.resnest import RESNEST_DEPTHS
from reid_engine.modeling.backbones.resnext import RESNEXT_DEPTHS
from reid_engine.modeling.backbones.vit import VIT_DEPTHS, ViTSpec

pytest.importorskip("onnxruntime")  # in requirements.txt: CI runs these tests
pytest.importorskip("onnx")

# label -> MODEL.* / INPUT.* overrides of the cheapest member (64 x 32 input unless said)
FAMILIES = {
    "resnet (Baseline)": ["MODEL.BACKBONE.DEPTH", "18x", "MODEL.BACKBONE.WIDTH_MULT", 0.25],
    "resnet-ibn": ["MODEL.BACKBONE.DEPTH", "18x", "MODEL.BACKBONE.WIDTH_MULT", 0.25, "MODEL.BACKBONE.WITH_IBN", True],
    "shufflenetv2": ["MODEL.BACKBONE.NAME", "build_shufflenetv2_backbone", "MODEL.BACKBONE.DEPTH", "0.5x"],
    "MGN": ["MODEL.META_ARCHITECTURE", "MGN", "MODEL.BACKBONE.DEPTH", "18x", "MODEL.BACKBONE.WIDTH_MULT", 0.25,
            "INPUT.SIZE_TEST", [96, 32]],
    "MoCo": ["MODEL.META_ARCHITECTURE", "MoCo", "MODEL.BACKBONE.DEPTH", "18x", "MODEL.BACKBONE.WIDTH_MULT", 0.25],
    "Distiller (EMA teacher)": ["MODEL.META_ARCHITECTURE", "Distiller", "KD.EMA.ENABLED", True,
                                "MODEL.BACKBONE.DEPTH", "18x", "MODEL.BACKBONE.WIDTH_MULT", 0.25],
    "VideoBaseline (per frame)": ["MODEL.META_ARCHITECTURE", "VideoBaseline", "MODEL.BACKBONE.DEPTH", "18x",
                                  "MODEL.BACKBONE.WIDTH_MULT", 0.25],
}
# the families that take longest to export and quantize (2-7 s each on an idle 2-core
# machine, many layers): the slow tier, so that the deploy tests of the fast tier stay
# under 30 s
SLOW = {
    "mobilenetv2": ["MODEL.BACKBONE.NAME", "build_mobilenetv2_backbone", "MODEL.BACKBONE.DEPTH", "0.1x"],
    "mobilenetv3": ["MODEL.BACKBONE.NAME", "build_mobilenetv3_backbone", "MODEL.BACKBONE.DEPTH", "Small"],
    "osnet": ["MODEL.BACKBONE.NAME", "build_osnet_backbone", "MODEL.BACKBONE.DEPTH", "x0_25"],
    "regnet": ["MODEL.BACKBONE.NAME", "build_regnet_backbone", "MODEL.BACKBONE.DEPTH", "200x"],
    "effnet": ["MODEL.BACKBONE.NAME", "build_effnet_backbone", "MODEL.BACKBONE.DEPTH", "b0"],
    "repvgg (fused)": ["MODEL.BACKBONE.NAME", "build_repvgg_backbone", "MODEL.BACKBONE.DEPTH", "A0"],
    "vit / TransReID": ["MODEL.META_ARCHITECTURE", "TransReID", "MODEL.BACKBONE.NAME", "build_vit_backbone",
                        "MODEL.BACKBONE.DEPTH", "tiny", "MODEL.BACKBONE.STRIDE_SIZE", (16, 16),
                        "MODEL.HEADS.POOL_LAYER", "Identity", "MODEL.JPM.NUM_PARTS", 2],
    "resnext": ["MODEL.BACKBONE.NAME", "build_resnext_backbone", "MODEL.BACKBONE.DEPTH", "tiny"],
    "resnest": ["MODEL.BACKBONE.NAME", "build_resnest_backbone", "MODEL.BACKBONE.DEPTH", "tiny"],
}
# "tiny" members: the family's own blocks, fewer of them (the smallest registered ones have
# 22-25 M parameters)
TINY_DEPTHS = [(VIT_DEPTHS, ViTSpec(dim=64, depth=2, heads=2)), (RESNEXT_DEPTHS, (1, 1, 1, 1)),
               (RESNEST_DEPTHS, ((1, 1, 1, 1), 32))]


@pytest.fixture(scope="module")
def calibration_images(data_root):
    return [path for path, _, _ in get_dataset("SyntheticReIDTiny", data_root).query[:8]]


def _cfg(data_root, overrides):
    cfg = get_cfg()
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.BACKBONE.PRETRAIN", False, "MODEL.HEADS.NUM_CLASSES", 8,
                         "INPUT.SIZE_TEST", [64, 32], "INPUT.SIZE_TRAIN", [64, 32], "DATASETS.ROOT", data_root,
                         "TEST.FLIP.ENABLED", False] + overrides)
    cfg.freeze()
    return cfg


def _export_and_quantize(cfg, folder, calibration_images):
    torch.manual_seed(0)
    model = build_model(cfg).eval().requires_grad_(False)
    result = export.export_model(cfg, str(folder), formats=["onnx"], model=model, check_batch_size=2)["onnx"]
    assert result["max_abs_diff"] is not None and result["max_abs_diff"] <= 1e-4
    fp32 = OnnxRuntimeModel(result["path"], threads=1)
    reader = export.CalibrationBatches(calibration_images, contract_config(cfg, fp32.contract), fp32.contract)
    int8 = OnnxRuntimeModel(export.quantize_onnx(result["path"], str(folder / "model_int8.onnx"), "int8", reader))
    images = export.random_images(3, (fp32.contract.input_height, fp32.contract.input_width), "uint8", seed=1)
    reference, quantized = fp32(images), int8(images)
    assert quantized.shape == reference.shape == (3, fp32.contract.feature_dim)
    assert np.isfinite(quantized.numpy()).all()
    assert int8.contract.quantization.startswith("int8 static QDQ")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_exports_fp32_and_int8(family, data_root, calibration_images, tmp_path):
    _export_and_quantize(_cfg(data_root, FAMILIES[family]), tmp_path, calibration_images)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(SLOW))
def test_slower_family_exports_fp32_and_int8(family, data_root, calibration_images, tmp_path, monkeypatch):
    for depths, spec in TINY_DEPTHS:
        monkeypatch.setitem(depths, "tiny", spec)
    _export_and_quantize(_cfg(data_root, SLOW[family]), tmp_path, calibration_images)
