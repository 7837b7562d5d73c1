"""`reid-export --format boxmot`: loaded by the real BoxMOT package, its features equal reid-extract's,
a BoxMOT tracker runs with it; and the metric plumbing of tools/track_synthetic.py."""
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from reid_engine import export
from reid_engine.cli import extract as extract_cli
from reid_engine.data.datasets import get_dataset
from reid_engine.data.synthetic import TINY_SPEC
from reid_engine.data.synthetic.sequence import TINY_SEQUENCE_SPEC, render_sequence
from reid_engine.export.boxmot import BOXMOT_FILE, IMAGENET_MEAN, IMAGENET_STD, require_boxmot_runtime, sidecar_path
from reid_engine.inference import load_features, read_contract
from reid_engine.utils.errors import MissingPackageError
from tests.conftest import REPO_ROOT
from tests.inference._helpers import tiny_cfg

pytest.importorskip("onnxruntime")  # in requirements.txt: CI runs these tests
onnx = pytest.importorskip("onnx")

# boxmot and motmetrics are test extras (requirements-nodeps.txt, requirements.txt): CI installs both
HAS_BOXMOT = importlib.util.find_spec("boxmot") is not None
needs_boxmot = pytest.mark.skipif(not HAS_BOXMOT,
                                  reason="boxmot is not installed (pip install --no-deps -r requirements-nodeps.txt)")


def _runtime_problem() -> str:
    """Why BoxMOT would change this environment on loading a model ("" when it would not)."""
    try:
        require_boxmot_runtime()
    except MissingPackageError as e:
        return str(e)
    return ""


# Loading a model where BoxMOT's runtime check fails would pip-install onnxruntime into the
# environment running the tests: such an environment skips these tests instead (CI's has the pin).
needs_boxmot_runtime = pytest.mark.skipif(not HAS_BOXMOT or bool(_runtime_problem()),
                                          reason=_runtime_problem() if HAS_BOXMOT else "boxmot is not installed")


def _load_tool():
    spec = importlib.util.spec_from_file_location("track_synthetic", os.path.join(REPO_ROOT, "tools",
                                                                                  "track_synthetic.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def boxmot_file(data_root, tiny_checkpoint, tiny_predictor, tmp_path_factory):
    """The BoxMOT export of the tiny checkpoint (input 64 x 32)."""
    out = str(tmp_path_factory.mktemp("boxmot"))
    return export.export_model(tiny_cfg(data_root, tiny_checkpoint), out, formats=("boxmot",),
                               model=tiny_predictor.model)["boxmot"]


@pytest.fixture(scope="module")
def tiny_sequence():
    """One pair of SyntheticReIDTiny's test people meeting and turning back, 12 frames."""
    import dataclasses

    return render_sequence(dataclasses.replace(TINY_SEQUENCE_SPEC, people=TINY_SPEC))


def test_the_file_its_sidecar_and_contract(boxmot_file):
    path = boxmot_file["path"]
    assert os.path.basename(path) == BOXMOT_FILE and boxmot_file["max_abs_diff"] <= 1e-4
    graph_input = onnx.load(path).graph.input[0]
    dims = [d.dim_value or d.dim_param for d in graph_input.type.tensor_type.shape.dim]
    assert dims == ["batch", 3, 64, 32]  # static H x W: BoxMOT takes them as its crop size
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    with open(sidecar_path(path), encoding="utf-8") as f:
        sidecar = json.load(f)
    assert sidecar["img_size"] == [64, 32] and sidecar["model_kwargs"] == {"img_size": [64, 32]}
    assert sidecar["model_name"] == "reid_engine" and sidecar["preprocess"] == "resize"
    contract = read_contract(path)
    assert contract == boxmot_file["contract"]
    assert (contract.input_dtype, contract.value_range, contract.normalization, contract.interpolation) == (
        "float32", "0..1", "outside", "bilinear")
    assert contract.pixel_stats() == (IMAGENET_MEAN, IMAGENET_STD)
    assert (contract.resize_height, contract.resize_width) == (64, 32)


@needs_boxmot
def test_boxmot_reads_the_name_and_size_from_the_sidecar_only(boxmot_file, tmp_path):
    from boxmot.reid.core.registry import ReIDModelRegistry

    path = boxmot_file["path"]
    assert ReIDModelRegistry.get_model_name(path) == "reid_engine"
    assert ReIDModelRegistry.get_checkpoint_model_kwargs(path) == {"img_size": (64, 32)}
    bare = str(tmp_path / BOXMOT_FILE)  # without its sidecar: the name guesses no architecture
    shutil.copy(path, bare)
    assert ReIDModelRegistry.get_model_name(bare) is None


@needs_boxmot
def test_boxmot_installs_nothing_exactly_where_onnxruntime_is_its_pin():
    from importlib.metadata import version

    assert (_runtime_problem() == "") == (version("onnxruntime") == "1.24.3"), _runtime_problem()
    if _runtime_problem():
        assert "pip install 'onnxruntime==1.24.3'" in _runtime_problem()


@pytest.mark.slow  # 7 s in CI: reid-extract and BoxMOT on the same crops
@needs_boxmot_runtime
def test_boxmot_encoder_features_equal_reid_extract(boxmot_file, data_root, tiny_config_file, tmp_path):
    from boxmot.reid.backends.onnx_backend import ONNXBackend
    from boxmot.reid.core import ReID

    backend = ReID(weights=boxmot_file["path"], device="cpu").model
    assert isinstance(backend, ONNXBackend) and backend.input_shape == (64, 32)
    # six 128 x 64 crops side by side in one frame, and as files for reid-extract
    crops = tmp_path / "crops"
    crops.mkdir()
    sources = [path for path, _, _ in get_dataset("SyntheticReIDTiny", data_root).query[:6]]
    for k, source in enumerate(sources):
        shutil.copy(source, crops / f"crop_{k}.jpg")
    images = [np.asarray(Image.open(crops / f"crop_{k}.jpg").convert("RGB")) for k in range(len(sources))]
    frame = np.ascontiguousarray(np.concatenate(images, axis=1)[:, :, ::-1])  # BGR, as BoxMOT's frames
    boxes = np.array([[64 * k, 0, 64 * k + 64, 128] for k in range(len(sources))], dtype=np.float32)
    theirs = backend.get_features(boxes, frame)
    out = str(tmp_path / "ours.npz")
    assert extract_cli.main(["--config-file", tiny_config_file, "--image-dir", str(crops), "--output", out]) == 0
    ours = load_features(out)["features"]
    cosine = np.sum(theirs * ours, axis=1)
    # OpenCV's bilinear 2x reduction against Pillow's bicubic one explains the rest
    assert cosine.min() >= 0.999, cosine


@needs_boxmot_runtime
def test_botsort_tracks_with_our_encoder(boxmot_file, tiny_sequence):
    tool = _load_tool()
    tracker = tool.make_tracker("botsort", boxmot_file["path"])
    tracks = tool.run_tracker(tracker, tiny_sequence, tiny_sequence.boxes)
    assert tracker.last_emb_size == boxmot_file["contract"].feature_dim  # our encoder embedded the boxes
    assert len(tracks) == len(tiny_sequence.frames) and all(len(ids) for ids, _ in tracks[1:])
    metrics = tool.mot_metrics(tool.ground_truth(tiny_sequence), tracks)
    assert 0.0 <= metrics["idf1"] <= 1.0 and metrics["id_switches"] >= 0


def test_metrics_of_perfect_and_swapped_tracks(tiny_sequence):
    pytest.importorskip("motmetrics")
    tool = _load_tool()
    truth = tool.ground_truth(tiny_sequence)
    perfect = tool.mot_metrics(truth, [(ids + 100, boxes) for ids, boxes in truth])
    assert perfect == {"idf1": 1.0, "id_switches": 0, "mota": 1.0}
    # the two people swap their track ids half way: one switch each, IDF1 lower
    half = len(truth) // 2
    swapped = [(np.where(ids == 1, 2, 1) if t >= half else ids, boxes) for t, (ids, boxes) in enumerate(truth)]
    metrics = tool.mot_metrics(truth, swapped)
    assert metrics["id_switches"] == 2 and metrics["idf1"] < 0.75
    # jittered boxes still match at IoU >= 0.5
    jittered = tool.jittered([b for _, b in truth], 0.03, seed=1)
    assert tool.mot_metrics(truth, [(ids, b) for (ids, _), b in zip(truth, jittered)])["idf1"] == 1.0
