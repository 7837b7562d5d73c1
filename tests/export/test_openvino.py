"""OpenVINO: IR export with the contract, the OpenVINO back end, NNCF int8 with verification."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from reid_engine import export
from reid_engine.cli import export as export_cli
from reid_engine.cli import extract as extract_cli
from reid_engine.config import get_cfg
from reid_engine.data.datasets import get_dataset
from reid_engine.export import ExportError
from reid_engine.inference import (
    ContractError,
    DefaultPredictor,
    DeployContract,
    ExportedModel,
    OpenVinoModel,
    load_features,
    read_contract,
    resolve_backend,
)
from reid_engine.utils.errors import MissingPackageError, UsageError
from tests.conftest import REPO_ROOT
from tests.inference._helpers import tiny_cfg

ov = pytest.importorskip("openvino")  # in requirements.txt: CI runs these tests
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def exported(data_root, tiny_checkpoint, tiny_predictor, tmp_path_factory):
    """The export results of the tiny checkpoint as ONNX and OpenVINO IR (uint8 input, normalized features)."""
    out = str(tmp_path_factory.mktemp("openvino"))
    return export.export_model(tiny_cfg(data_root, tiny_checkpoint), out, formats=["onnx", "openvino"],
                               model=tiny_predictor.model, source_config="configs/tiny.yml")


@pytest.fixture(scope="module")
def query_paths(data_root):
    return [path for path, _, _ in get_dataset("SyntheticReIDTiny", data_root).query]


def test_ir_carries_the_contract_and_matches_pytorch(exported, capsys):
    xml = exported["openvino"]["path"]
    assert os.path.basename(xml) == "model.xml" and os.path.isfile(xml[:-4] + ".bin")
    assert exported["openvino"]["max_abs_diff"] <= 1e-5  # checked against the unfused PyTorch model
    contract = read_contract(xml)  # plain XML: no openvino needed to read it
    assert contract == read_contract(exported["onnx"]["path"]) == exported["openvino"]["contract"]
    assert (contract.input_height, contract.input_width, contract.feature_dim) == (64, 32, 512)
    # what an OpenVINO user reads: one rt_info section, no stale copy of the ONNX metadata
    model = ov.Core().read_model(xml)
    assert model.get_rt_info(["reid_engine", "input_height"]).astype(str) == "64"
    assert not model.has_rt_info(["framework"])
    assert export_cli.main(["--inspect", xml]) == 0
    assert "feature_dim: 512" in capsys.readouterr().out


@pytest.mark.slow  # a fresh interpreter importing torch and OpenVINO
def test_loading_leaves_the_signal_stack_as_it_was(exported):
    # OpenVINO's first compile on a thread installs an ~11 KB alternate signal stack there, on which a
    # Python-handled SIGCHLD (a loader worker ending) could crash the process: a fresh process shows it.
    code = ("import sys; from reid_engine.reliability.signal_stack import current_signal_stack as s; b = s(); "
            "from reid_engine.inference import OpenVinoModel; m = OpenVinoModel(sys.argv[1]); print(b == s(), b, s())")
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, exported["openvino"]["path"]],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert proc.returncode == 0 and proc.stdout.startswith("True"), proc.stdout + proc.stderr[-2000:]


def test_contract_errors_of_xml_files(tmp_path):
    plain = tmp_path / "plain.xml"
    plain.write_text('<net name="x"><rt_info><other value="1"/></rt_info></net>')
    with pytest.raises(ContractError, match="carries no reid_engine preprocessing contract"):
        read_contract(str(plain))
    broken = tmp_path / "broken.xml"
    broken.write_text("<net")
    with pytest.raises(ContractError, match="is not an OpenVINO IR .xml file") as info:
        read_contract(str(broken))
    assert "\n" not in str(info.value)


def test_openvino_predictor_equals_pytorch(exported, query_paths, tiny_predictor):
    reference = tiny_predictor(query_paths[:20])
    for weights, backend in ((exported["openvino"]["path"], None), (exported["onnx"]["path"], "openvino")):
        cfg = get_cfg()  # the file's contract is enough: no model config
        cfg.merge_from_list(["MODEL.WEIGHTS", weights])
        predictor = DefaultPredictor(cfg, batch_size=7, backend=backend)
        assert predictor.backend == "openvino" and isinstance(predictor.model, OpenVinoModel)
        assert list(predictor.cfg.INPUT.SIZE_TEST) == [64, 32]
        features = predictor(query_paths[:20])
        assert features.shape == (20, 512) and features.dtype == torch.float32
        assert (features - reference).abs().max().item() <= 1e-5


def test_reid_extract_with_the_openvino_backend_equals_pytorch(exported, tiny_config_file, query_paths, tiny_predictor,
                                                               tmp_path):
    # the reference is the session's PyTorch predictor (reid-extract's PyTorch path: test_deploy)
    out = str(tmp_path / "openvino.npz")
    opts = ["--backend", "openvino", "MODEL.WEIGHTS", exported["openvino"]["path"]]
    assert extract_cli.main(["--config-file", tiny_config_file, "--split", "query", "--output", out] + opts) == 0
    features = load_features(out)
    assert list(features["paths"]) == list(query_paths)
    np.testing.assert_allclose(features["features"], tiny_predictor(list(query_paths)).numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow  # two evaluations; the fast tier keeps eval-only on an ONNX file (test_deploy) and IR == PyTorch
def test_eval_only_evaluates_the_ir_like_the_onnx_file(exported, tiny_config_file, tmp_path):
    from reid_engine.cli import train as train_cli

    results = {}
    for name in ("onnx", "openvino"):
        opts = ["OUTPUT_DIR", str(tmp_path / name), "MODEL.WEIGHTS", exported[name]["path"]]
        args = train_cli.build_parser().parse_args(["--config-file", tiny_config_file, "--eval-only"] + opts)
        results[name] = train_cli.train_worker(args)["SyntheticReIDTiny"]
    for metric in ("mAP", "Rank-1", "mINP"):
        assert results["openvino"][metric] == pytest.approx(results["onnx"][metric], abs=1e-3)


def test_backend_choice_for_openvino_files():
    assert resolve_backend("out/model.xml") == "openvino" and resolve_backend("m.onnx", "openvino") == "openvino"
    for backend, message in (("pytorch", "m.xml is an OpenVINO IR file, which the pytorch back end cannot load"),
                             ("onnxruntime", "use --backend openvino")):
        with pytest.raises(UsageError, match=message):
            resolve_backend("m.xml", backend)
    with pytest.raises(UsageError, match="use pytorch, onnxruntime, openvino"):
        resolve_backend("m.xml", "tensorrt")


def test_missing_openvino_is_one_line(exported, data_root, tiny_checkpoint, tiny_config_file, monkeypatch, tmp_path,
                                      capsys):
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(MissingPackageError) as info:
        OpenVinoModel(exported["openvino"]["path"])
    assert str(info.value).endswith("pip install openvino") and "\n" not in str(info.value)
    out = tmp_path / "out"
    with pytest.raises(MissingPackageError):  # before anything is written
        export.export_model(tiny_cfg(data_root, tiny_checkpoint), str(out), formats=["onnx", "openvino"])
    assert not out.exists() or not os.listdir(out)
    assert export_cli.main(["--config-file", tiny_config_file, "--output", str(out), "--format", "openvino"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("pip install openvino") and len(err.splitlines()) == 1


def test_dynamic_quantization_is_refused_for_openvino_alone(tiny_config_file, tmp_path, capsys):
    out = tmp_path / "out"
    flags = ["--output", str(out), "--format", "openvino", "--quantize", "dynamic"]
    assert export_cli.main(["--config-file", tiny_config_file] + flags) == 2
    err = capsys.readouterr().err.strip()
    assert "--quantize dynamic is ONNX Runtime's" in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.fixture(scope="module")
def small_config_file(data_root, tmp_path_factory):
    """A config file of a seeded quarter-width ResNet-18 checkpoint (quick to quantize)."""
    from reid_engine.modeling import build_model
    from reid_engine.utils.checkpoint import Checkpointer

    cfg = tiny_cfg(data_root, extra=["MODEL.BACKBONE.WIDTH_MULT", 0.25, "MODEL.HEADS.NUM_CLASSES", 8])
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("small_ov")
    Checkpointer(build_model(cfg), str(folder)).save("model_final")
    cfg = cfg.clone()
    cfg.defrost()
    cfg.MODEL.WEIGHTS = str(folder / "model_final.pth")
    path = folder / "small.yaml"
    path.write_text(cfg.dump())
    return str(path)


@pytest.mark.slow
def test_nncf_int8_is_verified_and_kept_within_the_allowed_drop(small_config_file, tmp_path):
    """reid-export --format openvino --quantize int8: verified and kept within --max-map-drop.

    The refusal beyond it is the decision every int8 path shares (`keep_if_accurate`): proven on
    ONNX Runtime's int8 in test_deploy; the removal of both pending IR files in
    test_keep_if_accurate_refuses_failures_and_leaves_nothing below."""
    kept = tmp_path / "kept"
    base = ["--config-file", small_config_file, "--format", "openvino", "--quantize", "int8",
            "--calibration", "train", "--calibration-size", "24"]
    assert export_cli.main(base + ["--output", str(kept), "--max-map-drop", "100"]) == 0
    assert sorted(os.listdir(kept)) == ["model.bin", "model.xml", "model_int8.bin", "model_int8.xml"]
    int8 = OpenVinoModel(str(kept / "model_int8.xml"))
    assert int8.contract.quantization.startswith("int8 NNCF post-training")
    assert int8.contract.feature_dim == 128 and read_contract(str(kept / "model.xml")).quantization == "none"
    features = int8(export.random_images(4, (64, 32), "uint8", seed=5))
    assert features.shape == (4, 128) and torch.isfinite(features).all()


class _ConstantModel(ExportedModel):
    """An exported-model stand-in whose features are all `value`."""

    def __init__(self, value: float):
        super().__init__("stub.xml", DeployContract(input_height=8, input_width=4, resize_height=8, resize_width=4,
                                                    feature_dim=4))
        self.value = value

    def run(self, images):
        return np.full((len(images), 4), self.value, dtype=np.float32)


@pytest.mark.parametrize("failure, message", [("raises", "NNCF could not quantize x"),
                                              ("nan", "returns non-finite features")])
def test_keep_if_accurate_refuses_failures_and_leaves_nothing(failure, message, tmp_path):
    """A quantizer that fails after writing, or whose model returns NaN, leaves no file behind (one-line error)."""
    pending = {str(tmp_path / "a.unverified.xml"): str(tmp_path / "a.xml"),
               str(tmp_path / "a.unverified.bin"): str(tmp_path / "a.bin")}

    def quantizer():
        for path in pending:
            open(path, "w").close()
        if failure == "raises":
            raise ExportError("NNCF could not quantize x")
        return _ConstantModel(float("nan"))

    with pytest.raises(ExportError, match=message) as info:
        export.keep_if_accurate(get_cfg(), _ConstantModel(1.0), quantizer, pending, speed_batch=2)
    assert "\n" not in str(info.value) and os.listdir(tmp_path) == []
