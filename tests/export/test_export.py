"""reid_engine.export: TorchScript and ONNX exports equal PyTorch; unsupported layers are named."""
import pytest
import torch
from torch import nn

from reid_engine import export
from reid_engine.export import ExportError
from reid_engine.inference import FeatureExtractor
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
    import logging

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
