"""Inductor's on-disk caches make a second process compiling the same model and shapes load its
graphs instead of compiling them: two real processes, one cache folder, on the CPU (inductor's C++
back end; a GPU run keeps its Triton kernels the same way)."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

# A small CNN with repeated blocks, compiled by reid_engine's compile_model (blocks scope), one
# training step; prints the step time and inductor's / AOTAutograd's cache counters.
_CHILD = r"""
import json, time, torch
from torch import nn
from reid_engine.runtime.compile import compile_model
torch.set_num_threads(1)
class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Block(8), Block(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 4))
compile_model(model, "default", "inductor", scope="blocks")
x = torch.randn(4, 3, 16, 8)
start = time.perf_counter()
model(x).sum().backward()
seconds = time.perf_counter() - start
c = torch._dynamo.utils.counters
print("RESULT " + json.dumps({"seconds": seconds, "fx_hit": c["inductor"]["fxgraph_cache_hit"],
                              "fx_miss": c["inductor"]["fxgraph_cache_miss"],
                              "aot_hit": c["aot_autograd"]["autograd_cache_hit"]}))
"""


def _run(cache_dir: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, PYTHONPATH=REPO_ROOT)
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_a_second_process_loads_the_compiled_graphs_from_the_cache(tmp_path):
    cache = str(tmp_path / "inductor")
    cold = _run(cache)
    warm = _run(cache)
    print(f"first process {cold['seconds']:.1f} s, second {warm['seconds']:.1f} s")
    assert cold["fx_miss"] > 0 and cold["fx_hit"] == 0  # compiled: forward and backward graphs
    assert warm["fx_miss"] == 0 and (warm["fx_hit"] > 0 or warm["aot_hit"] > 0)  # nothing compiled again
    assert warm["seconds"] < cold["seconds"]
