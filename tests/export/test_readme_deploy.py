"""The deploy snippet of docs/deployment.md (numpy, Pillow and onnxruntime only) runs and gives the PyTorch embeddings."""
import ast
import os
import re

import pytest

from reid_engine import export
from reid_engine.data.datasets import get_dataset
from tests.conftest import REPO_ROOT
from tests.inference._helpers import tiny_cfg

pytest.importorskip("onnxruntime")  # in requirements.txt: CI runs this test
pytest.importorskip("onnx")


def _snippet() -> str:
    with open(os.path.join(REPO_ROOT, "docs", "deployment.md"), encoding="utf-8") as f:
        text = f.read()
    match = re.search(r"<!-- deploy-snippet -->\n```python\n(.*?)```", text, re.S)
    assert match, "docs/deployment.md lost its deploy snippet (the block after <!-- deploy-snippet -->)"
    return match.group(1)


def test_snippet_imports_only_numpy_pillow_and_onnxruntime():
    modules = set()
    for node in ast.walk(ast.parse(_snippet())):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module.split(".")[0])
    assert modules == {"numpy", "onnxruntime", "PIL"}


def test_snippet_equals_the_pytorch_predictor(data_root, tiny_checkpoint, tiny_predictor, tmp_path):
    """With a center crop too (resize to 72 x 36, crop 64 x 32), so every step of the snippet counts."""
    extra = ["INPUT.SIZE_TEST", [72, 36], "INPUT.CROP.ENABLED", True, "INPUT.CROP.SIZE", [64, 32]]
    cfg = tiny_cfg(data_root, tiny_checkpoint, extra=extra)
    model_path = export.export_model(cfg, str(tmp_path), formats=["onnx"], model=tiny_predictor.model)["onnx"]["path"]
    paths = [p for p, _, _ in get_dataset("SyntheticReIDTiny", data_root).query[:3]]
    code = _snippet().replace('"exported/model.onnx"', repr(model_path))
    code = code.replace('["person1.jpg", "person2.jpg"]', repr(paths))
    namespace = {}
    exec(compile(code, "docs/deployment.md deploy snippet", "exec"), namespace)
    from reid_engine.inference import DefaultPredictor

    expected = DefaultPredictor(cfg)(paths).numpy()  # the tiny checkpoint, resized and cropped
    assert namespace["features"].shape == expected.shape
    assert abs(namespace["features"] - expected).max() <= 1e-5
    assert abs(namespace["similarity"].diagonal() - 1).max() <= 1e-5
