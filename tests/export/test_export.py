"""reid_engine.export: TorchScript and ONNX exports equal PyTorch; unsupported layers are named; the contract."""
import hashlib
import logging
import os

import pytest
import torch
from torch import nn

from reid_engine import export
from reid_engine.config import get_cfg
from reid_engine.export import ExportError
from reid_engine.export.quantize import folded_root_warnings, quantize_onnx
from reid_engine.inference import ContractError, DeployContract, FeatureExtractor, read_contract
from tests.inference._helpers import tiny_cfg


@pytest.fixture(scope="module")
def exported(data_root, tiny_checkpoint, tiny_predictor, tmp_path_factory):
    """Both exports of the tiny model (uint8 input, normalised features) and the check results."""
    out = str(tmp_path_factory.mktemp("export"))
    return export.export_model(tiny_cfg(data_root, tiny_checkpoint), out, batch_size=2, check_batch_size=3,
                             model=tiny_predictor.model)


def _features(model, images):
    """The normalised features of the eager PyTorch model."""
    with torch.no_grad():
        return FeatureExtractor(model)(images)


def _reference(tiny_predictor, images):
    return _features(tiny_predictor.model, images)


@pytest.mark.slow
def test_torchscript_equals_pytorch_on_another_batch_size(exported, tiny_predictor):
    assert exported["torchscript"]["max_abs_diff"] <= 1e-4
    images = export.random_images(5, (64, 32), "uint8", seed=7)
    outputs = torch.from_numpy(export.run_torchscript(exported["torchscript"]["path"], images))
    assert outputs.shape == (5, 512)
    torch.testing.assert_close(outputs, _reference(tiny_predictor, images), atol=1e-5, rtol=0)
    torch.testing.assert_close(outputs.norm(dim=1), torch.ones(5), atol=1e-5, rtol=0)


def test_onnx_has_a_dynamic_batch_and_equals_pytorch(exported, tiny_predictor):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    assert exported["onnx"]["max_abs_diff"] is not None and exported["onnx"]["max_abs_diff"] <= 1e-4
    graph = onnx.load(exported["onnx"]["path"]).graph
    assert [i.name for i in graph.input] == ["images"] and [o.name for o in graph.output] == ["features"]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    for batch in (1, 6):
        images = export.random_images(batch, (64, 32), "uint8", seed=batch)
        outputs = torch.from_numpy(export.run_onnx(exported["onnx"]["path"], images))
        assert outputs.shape == (batch, 512)
        assert (outputs - _reference(tiny_predictor, images)).abs().max().item() <= 1e-4


def test_raw_float_export(tiny_predictor, tmp_path):
    module = FeatureExtractor(tiny_predictor.model, normalize=False)
    images = export.random_images(2, (64, 32), "float32", seed=3)
    path = export.export_torchscript(module, images, str(tmp_path / "raw.pt"))
    outputs = torch.from_numpy(export.run_torchscript(path, images))
    with torch.no_grad():
        expected = tiny_predictor.model(images)
    torch.testing.assert_close(outputs, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(outputs.norm(dim=1), torch.ones(2), atol=1e-2)  # raw: not normalised


class CumMaxPool(nn.Module):
    """A pooling layer built on aten::cummax, which ONNX cannot express."""

    def forward(self, x):
        return torch.cummax(x, dim=2)[0].mean(dim=(2, 3), keepdim=True)


def test_unsupported_onnx_operator_names_the_layer(tiny_predictor, tmp_path, monkeypatch):
    monkeypatch.setattr(tiny_predictor.model.heads, "pool_layer", CumMaxPool())
    images = export.random_images(2, (64, 32), "uint8", seed=0)
    with pytest.raises(ExportError) as info:
        export.export_onnx(FeatureExtractor(tiny_predictor.model), images, str(tmp_path / "bad.onnx"))
    message = str(info.value)
    assert "\n" not in message
    assert "operator aten::cummax (opset 17) is not supported" in message
    assert "used by model.heads.pool_layer (CumMaxPool)" in message


class Unscriptable(nn.Module):
    """A layer that traces fine but cannot be scripted (a non-literal getattr)."""

    def __init__(self):
        super().__init__()
        self.scale = 2.0

    def forward(self, x):
        name = "scale" if x.dim() > 0 else "missing"
        return x * getattr(self, name)


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bad = Unscriptable()

    def forward(self, images):
        return self.bad(self.conv(images.float())).mean(dim=(2, 3))


def test_unscriptable_layer_is_named_and_trace_still_works(tmp_path):
    module = FeatureExtractor(TinyNet().eval())
    images = export.random_images(2, (8, 8), "uint8", seed=0)
    with pytest.raises(ExportError) as info:
        export.export_torchscript(module, images, str(tmp_path / "s.pt"), mode="script")
    message = str(info.value)
    assert message.startswith("TorchScript scripting failed in module model.bad (Unscriptable): ")
    assert "--torchscript-mode trace" in message and "\n" not in message
    path = export.export_torchscript(module, images, str(tmp_path / "t.pt"), mode="trace")
    with torch.no_grad():
        expected = module(images)
    torch.testing.assert_close(torch.from_numpy(export.run_torchscript(path, images)), expected)


# ----------------------------------------------------------------------------- deploy fusion
def _repvgg_cfg(data_root):
    return tiny_cfg(data_root, extra=["MODEL.BACKBONE.NAME", "build_repvgg_backbone", "MODEL.BACKBONE.DEPTH", "A0",
                                      "MODEL.HEADS.NUM_CLASSES", 24])


@pytest.fixture(scope="module")
def repvgg_model(data_root):
    """An eval-mode Baseline with a RepVGG-A0 trunk and non-trivial norm statistics."""
    from reid_engine.modeling import build_model

    torch.manual_seed(0)
    model = build_model(_repvgg_cfg(data_root))
    gen = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=gen) * 0.2)
            module.running_var.copy_(torch.rand(module.num_features, generator=gen) + 0.5)
    return model.eval().requires_grad_(False)


def _export_logs(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("reid_engine"), "propagate", True)
    caplog.set_level(logging.INFO)
    return caplog


@pytest.mark.slow
def test_repvgg_export_is_fused_and_equals_the_unfused_model(repvgg_model, data_root, tmp_path, caplog, monkeypatch):
    logs = _export_logs(caplog, monkeypatch)
    results = export.export_model(_repvgg_cfg(data_root), str(tmp_path), model=repvgg_model)
    assert "Fused 22 blocks for deployment (22 RepVGGBlock)" in logs.text
    assert results["torchscript"]["max_abs_diff"] <= 1e-4
    assert any(".rbr_dense." in k for k in repvgg_model.state_dict())  # the caller's model is not changed
    keys = torch.jit.load(results["torchscript"]["path"]).state_dict()
    assert "model.backbone.stage1.1.rbr_reparam.weight" in keys
    assert not any("rbr_dense" in k or "rbr_identity" in k for k in keys)
    images = export.random_images(4, (64, 32), "uint8", seed=11)
    expected = _features(repvgg_model, images)
    outputs = torch.from_numpy(export.run_torchscript(results["torchscript"]["path"], images))
    assert (outputs - expected).abs().max().item() <= 1e-4
    if export.run_onnx(results["onnx"]["path"], images) is not None:
        assert results["onnx"]["max_abs_diff"] <= 1e-4
        onnx_out = torch.from_numpy(export.run_onnx(results["onnx"]["path"], images))
        assert (onnx_out - expected).abs().max().item() <= 1e-4


def test_repvgg_export_without_fusion(repvgg_model, data_root, tmp_path):
    results = export.export_model(_repvgg_cfg(data_root), str(tmp_path), formats=["torchscript"],
                                  model=repvgg_model, fuse=False)
    keys = torch.jit.load(results["torchscript"]["path"]).state_dict()
    assert "model.backbone.stage1.1.rbr_identity.running_var" in keys
    assert results["torchscript"]["max_abs_diff"] <= 1e-4


# --------------------------------------------------------------------------- the contract (version 2)

IMAGENET_0_1 = {"pixel_mean": "0.485,0.456,0.406", "pixel_std": "0.229,0.224,0.225"}


def _contract(**changes):
    return DeployContract(input_height=64, input_width=32, resize_height=64, resize_width=32, feature_dim=8, **changes)


def test_the_contract_names_mean_std_where_they_apply_and_the_checkpoint_by_checksum(exported, tiny_checkpoint):
    pytest.importorskip("onnx")
    contract = read_contract(exported["onnx"]["path"])
    assert contract == exported["onnx"]["contract"] and contract.contract_version == 2
    assert contract.normalization == "inside" and contract.channel_order == "RGB" and contract.value_range == "0..255"
    assert contract.pixel_stats() == ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))  # MODEL.PIXEL_MEAN / STD
    with open(tiny_checkpoint, "rb") as f:
        assert contract.source_checkpoint_sha256 == hashlib.sha256(f.read()).hexdigest()
    assert contract.source_checkpoint == "model_final.pth"
    folder = os.path.dirname(tiny_checkpoint)
    assert not any(folder in value for value in contract.to_dict().values())  # no local paths
    text = contract.describe()
    assert "normalization inside the graph: feed the values unnormalized" in text
    assert "mean 123.675,116.28,103.53, std 58.395,57.12,57.375 (RGB, units of 0..255)" in text


def test_version_1_files_read_and_files_normalized_outside_are_described_and_refused():
    v1 = {k: v for k, v in _contract().to_dict().items()
          if k not in ("normalization", "pixel_mean", "pixel_std", "source_checkpoint_sha256")}
    old = DeployContract.from_dict(dict(v1, contract_version="1"))
    assert old.contract_version == 1 and old.normalization == "inside" and old.pixel_stats() is None
    assert "mean / std not recorded (contract version 1)" in old.describe()
    assert old.configure(get_cfg()).INPUT.SIZE_TEST == [64, 32]
    outside = _contract(normalization="outside", value_range="0..1", input_dtype="float32", **IMAGENET_0_1)
    assert DeployContract.from_dict(outside.to_dict()) == outside
    text = outside.describe()
    assert "float32 values 0..1" in text and "outside the graph: the client computes (x - mean) / std" in text
    assert "mean 0.485,0.456,0.406, std 0.229,0.224,0.225 (RGB, units of 0..1)" in text
    with pytest.raises(ContractError) as info:
        outside.configure(get_cfg())
    assert "normalized outside the graph" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ContractError, match="normalization='both'"):
        DeployContract.from_dict(dict(outside.to_dict(), normalization="both"))
    with pytest.raises(ContractError, match="not 3 comma-separated numbers"):
        _contract(pixel_mean="1,2", pixel_std="1,1,1").pixel_stats()


def test_root_logger_warnings_of_the_quantizer_fold_into_one_line(caplog, monkeypatch):
    _export_logs(caplog, monkeypatch)
    with folded_root_warnings():
        for name in ("a", "b", "c"):  # what onnxruntime's QDQ quantizer logs for IBN models
            logging.warning(f"Axis 1 is out-of-range for weight '{name}' with rank 1")
        logging.warning("Something else about 'x'")
        logging.getLogger("reid_engine.test").warning("our own warning")
    logging.warning("after the quantization")
    assert [r.getMessage() for r in caplog.records if r.name == "root"] == ["after the quantization"]
    assert any(r.getMessage() == "our own warning" for r in caplog.records)
    summaries = [r for r in caplog.records if r.name == "reid_engine.export.quantize"]
    assert len(summaries) == 1 and summaries[0].levelno == logging.WARNING  # one kind has no known meaning
    text = summaries[0].getMessage()
    assert "4 warning(s) folded" in text and "3x \"Axis 1 is out-of-range for weight 'a' with rank 1\"" in text
    assert "quantized per tensor instead of per channel" in text and "1x \"Something else about 'x'\"" in text


@pytest.mark.slow
def test_quantizing_an_ibn_model_prints_one_summary_line(data_root, tmp_path, caplog, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from reid_engine.modeling import build_model

    cfg = tiny_cfg(data_root, extra=["MODEL.BACKBONE.WIDTH_MULT", 0.25, "MODEL.HEADS.NUM_CLASSES", 8,
                                     "MODEL.BACKBONE.WITH_IBN", True])
    torch.manual_seed(0)
    path = export.export_model(cfg, str(tmp_path), formats=["onnx"], model=build_model(cfg).eval())["onnx"]["path"]

    class Batches:  # two calibration batches of random images
        paths = ["a", "b", "c", "d"]

        def __init__(self):
            self.seeds = iter((1, 2))

        def get_next(self):
            seed = next(self.seeds, None)
            return None if seed is None else {"images": export.random_images(2, (64, 32), "uint8", seed).numpy()}

        def rewind(self):
            self.seeds = iter((1, 2))

    _export_logs(caplog, monkeypatch)
    quantize_onnx(path, str(tmp_path / "int8.onnx"), "int8", Batches())
    assert not [r for r in caplog.records if r.name == "root" and r.levelno >= logging.WARNING]
    summaries = [r.getMessage() for r in caplog.records if "folded into this line" in r.getMessage()]
    assert len(summaries) == 1 and "Axis 1 is out-of-range for weight" in summaries[0], summaries
    assert read_contract(str(tmp_path / "int8.onnx")).quantization.startswith("int8 static")
