"""Deployment: self-describing exports, the ONNX Runtime back end, int8 quantization with verification."""
import os
import sys

import numpy as np
import pytest
import torch

from reid_engine import export
from reid_engine.cli import export as export_cli
from reid_engine.cli import extract as extract_cli
from reid_engine.cli import train as train_cli
from reid_engine.config import get_cfg
from reid_engine.data.datasets import get_dataset
from reid_engine.export import ExportError
from reid_engine.inference import (
    ContractError,
    DefaultPredictor,
    DeployContract,
    OnnxRuntimeModel,
    load_features,
    read_contract,
    resolve_backend,
)
from reid_engine.utils.errors import MissingPackageError, UsageError
from tests.inference._helpers import tiny_cfg

ort = pytest.importorskip("onnxruntime")  # in requirements.txt: CI runs these tests
pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def deployed(data_root, tiny_checkpoint, tiny_predictor, tmp_path_factory):
    """model.pt and model.onnx of the tiny checkpoint (uint8 input, normalized features)."""
    out = str(tmp_path_factory.mktemp("deploy"))
    results = export.export_model(tiny_cfg(data_root, tiny_checkpoint), out, model=tiny_predictor.model,
                                  source_config="configs/tiny.yml")
    return {name: result["path"] for name, result in results.items()}


@pytest.fixture(scope="module")
def query_paths(data_root):
    return [path for path, _, _ in get_dataset("SyntheticReIDTiny", data_root).query]


def test_contract_round_trips_and_rejects_files_without_one():
    contract = DeployContract(input_height=96, input_width=48, resize_height=100, resize_width=50, feature_dim=256,
                              normalized_features=False, flip_averaged=True)
    values = contract.to_dict()
    assert values["normalized_features"] == "false" and values["input_height"] == "96"
    assert DeployContract.from_dict(dict(values, other_tool="x")) == contract
    assert DeployContract.from_json(contract.to_json()) == contract
    with pytest.raises(ContractError) as info:
        DeployContract.from_dict({"producer": "someone"}, source="x.onnx")
    assert "x.onnx carries no reid_engine preprocessing contract" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ContractError, match="normalized_features='yes'"):
        DeployContract.from_dict(dict(values, normalized_features="yes"))


def test_both_files_carry_the_contract(deployed, tiny_checkpoint):
    onnx_contract, ts_contract = read_contract(deployed["onnx"]), read_contract(deployed["torchscript"])
    assert onnx_contract == ts_contract
    assert (onnx_contract.input_height, onnx_contract.input_width, onnx_contract.feature_dim) == (64, 32, 512)
    assert onnx_contract.interpolation == "bicubic" and onnx_contract.channel_order == "RGB"
    assert onnx_contract.input_dtype == "uint8" and onnx_contract.value_range == "0..255"
    assert onnx_contract.normalized_features and not onnx_contract.flip_averaged
    # file names and a content checksum, no local paths
    assert onnx_contract.source_checkpoint == os.path.basename(tiny_checkpoint) and onnx_contract.source_config == "tiny.yml"
    assert len(onnx_contract.source_checkpoint_sha256) == 64
    assert onnx_contract.quantization == "none" and onnx_contract.reid_engine_version
    # what a plain onnxruntime user reads
    meta = ort.InferenceSession(deployed["onnx"]).get_modelmeta().custom_metadata_map
    assert meta["input_height"] == "64" and meta["interpolation"] == "bicubic" and meta["feature_dim"] == "512"
    # the TorchScript module still loads and the contract is also readable through torch
    extra = {"reid_engine_contract.json": ""}
    torch.jit.load(deployed["torchscript"], _extra_files=extra)
    assert DeployContract.from_json(extra["reid_engine_contract.json"]) == ts_contract


def test_inspect_prints_the_contract(deployed, capsys, tmp_path):
    assert export_cli.main(["--inspect", deployed["onnx"]]) == 0
    out = capsys.readouterr().out
    assert "B x 3 x 64 x 32, RGB, uint8 values 0..255" in out and "bicubic" in out
    assert "B x 512 float32, L2-normalized" in out and "feature_dim: 512" in out
    assert export_cli.main(["--inspect", deployed["torchscript"]]) == 0
    assert "feature_dim: 512" in capsys.readouterr().out
    other = tmp_path / "plain.pt"
    torch.jit.save(torch.jit.script(torch.nn.ReLU()), str(other))
    assert export_cli.main(["--inspect", str(other)]) == 1
    assert "carries no reid_engine preprocessing contract" in capsys.readouterr().err


def test_contract_is_read_without_the_onnx_package(deployed, monkeypatch):
    expected = read_contract(deployed["onnx"])
    monkeypatch.setitem(sys.modules, "onnx", None)
    assert read_contract(deployed["onnx"]) == expected


def test_onnx_predictor_equals_pytorch_on_dataset_images(deployed, query_paths, tiny_predictor):
    cfg = get_cfg()  # the file's contract is enough: no model config, and a default INPUT.SIZE_TEST
    cfg.merge_from_list(["MODEL.WEIGHTS", deployed["onnx"]])
    predictor = DefaultPredictor(cfg, batch_size=7)
    assert predictor.backend == "onnxruntime" and list(predictor.cfg.INPUT.SIZE_TEST) == [64, 32]
    features = predictor(query_paths[:20])
    assert features.shape == (20, 512) and features.dtype == torch.float32
    assert (features - tiny_predictor(query_paths[:20])).abs().max().item() <= 1e-5


def test_backend_choice_and_missing_onnxruntime_is_one_line(deployed, monkeypatch):
    assert resolve_backend("a/model.onnx") == "onnxruntime" and resolve_backend("m.pth") == "pytorch"
    with pytest.raises(UsageError, match="is an ONNX file"):
        resolve_backend("m.onnx", "pytorch")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingPackageError) as info:
        OnnxRuntimeModel(deployed["onnx"])
    assert str(info.value).endswith("pip install onnxruntime") and "\n" not in str(info.value)


def test_reid_extract_with_the_onnx_file_equals_pytorch(deployed, tiny_config_file, tmp_path):
    outputs = {}
    for name, weights in (("onnx", deployed["onnx"]), ("pytorch", None)):
        out = str(tmp_path / f"{name}.npz")
        opts = ["MODEL.WEIGHTS", weights] if weights else []
        assert extract_cli.main(["--config-file", tiny_config_file, "--split", "query", "--output", out] + opts) == 0
        outputs[name] = load_features(out)
    assert outputs["onnx"]["paths"] == outputs["pytorch"]["paths"]
    np.testing.assert_allclose(outputs["onnx"]["features"], outputs["pytorch"]["features"], atol=1e-5, rtol=0)


def test_eval_only_evaluates_the_onnx_file_like_the_checkpoint(deployed, tiny_config_file, tmp_path):
    results = {}
    for name, weights in (("onnx", deployed["onnx"]), ("pytorch", None)):
        opts = ["OUTPUT_DIR", str(tmp_path / name)] + (["MODEL.WEIGHTS", weights] if weights else [])
        args = train_cli.build_parser().parse_args(["--config-file", tiny_config_file, "--eval-only"] + opts)
        results[name] = train_cli.train_worker(args)["SyntheticReIDTiny"]
    for metric in ("mAP", "Rank-1", "mINP"):
        assert results["onnx"][metric] == pytest.approx(results["pytorch"][metric], abs=1e-3)


@pytest.fixture(scope="module")
def small_export(data_root, tmp_path_factory):
    """(config, model.onnx) of a quarter-width ResNet-18 (quick to quantize), alone in its folder."""
    from reid_engine.modeling import build_model

    cfg = tiny_cfg(data_root, extra=["MODEL.BACKBONE.WIDTH_MULT", 0.25, "MODEL.HEADS.NUM_CLASSES", 8])
    torch.manual_seed(0)
    model = build_model(cfg).eval().requires_grad_(False)
    folder = str(tmp_path_factory.mktemp("small"))
    return cfg, export.export_model(cfg, folder, formats=["onnx"], model=model)["onnx"]["path"]


def test_int8_quantization_is_verified_and_a_large_drop_keeps_only_fp32(small_export):
    """The tiny test split gives the mAPs."""
    cfg, fp32 = small_export
    folder = os.path.dirname(fp32)
    result = export.quantize_and_verify(cfg, fp32, "int8", calibration="train", calibration_size=24,
                                        max_map_drop=100.0, speed_seconds=0.2)
    assert result["path"] == os.path.join(folder, "model_int8.onnx") and os.path.isfile(result["path"])
    assert result["drop"] == pytest.approx(result["fp32_map"] - result["int8_map"])
    assert result["fp32_ips"] > 0 and result["int8_ips"] > 0
    contract = read_contract(result["path"])
    assert contract.quantization.startswith("int8 static QDQ") and contract.feature_dim == 128
    quantized = OnnxRuntimeModel(result["path"])
    images = export.random_images(4, (64, 32), "uint8", seed=5)
    assert quantized(images).shape == (4, 128)
    os.remove(result["path"])
    with pytest.raises(ExportError) as info:
        export.quantize_and_verify(cfg, fp32, "int8", calibration="train", calibration_size=8,
                                   max_map_drop=-1000.0, speed_seconds=0.1)
    message = str(info.value)
    assert "drops mAP by" in message and "--max-map-drop -1000" in message and "\n" not in message
    assert sorted(os.listdir(folder)) == ["model.onnx"]  # no int8 file (nor a leftover), fp32 kept


def test_dynamic_quantization_needs_no_calibration(small_export, tmp_path):
    cfg, fp32 = small_export
    path = export.quantize_onnx(fp32, str(tmp_path / "dynamic.onnx"), "dynamic")
    model = OnnxRuntimeModel(path)
    assert model.contract.quantization.startswith("int8 dynamic")
    images = export.random_images(2, (64, 32), "uint8", seed=2)
    assert model(images).shape == (2, 128) and torch.isfinite(model(images)).all()


def test_calibration_needs_a_folder_or_a_split(data_root, tiny_checkpoint, tmp_path):
    cfg = tiny_cfg(data_root, tiny_checkpoint)
    with pytest.raises(UsageError, match="neither a folder nor a split"):
        export.calibration_paths(cfg, str(tmp_path / "missing"), 8)
    paths = export.calibration_paths(cfg, "query", 5)
    assert len(paths) == 5 and len(set(paths)) == 5


@pytest.mark.parametrize("flags, message", [
    (["--quantize", "int8"], "--quantize int8 needs calibration images (--calibration)"),
    (["--quantize", "int8", "--calibration", "no/such/dir"], "--calibration no/such/dir is neither a folder nor a split"),
    (["--quantize", "dynamic", "--format", "torchscript"], "--quantize works on the ONNX export"),
    ([], "no output folder (--output)"),
])
def test_export_command_rejects_bad_quantization_requests_before_exporting(flags, message, tiny_config_file,
                                                                           tmp_path, capsys):
    out = ["--output", str(tmp_path / "out")] if flags else []
    assert export_cli.main(["--config-file", tiny_config_file] + out + flags) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not os.path.exists(tmp_path / "out")
