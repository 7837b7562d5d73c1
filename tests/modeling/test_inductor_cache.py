"""Inductor's on-disk caches make a second process compiling the same model and shapes load its
graphs instead of compiling them: two real processes, one cache folder, on the CPU (a GPU run keeps
its Triton kernels the same way)."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

# The smallest model compiled by reid_engine's compile_model, one inference step: one graph, a single
# extern matrix product, so that inductor builds no C++ kernel (the cache keeps compiled graphs the
# same way whatever they hold); prints the step time and inductor's / AOTAutograd's cache counters.
# One compile thread: no pool of compile workers to start, the same cache.
_CHILD = r"""
import json, time, torch
from torch import nn
from reid_engine.runtime.compile import compile_model
torch.set_num_threads(1)
class Net(nn.Module):  # a module of the script's own, as a model is (a Sequential of torch.nn layers compiled nothing)
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)
    def forward(self, x):
        return self.linear(x)  # one extern matrix product: no C++ kernel to build, still one cached graph
model = Net()
compile_model(model, "default", "inductor")
start = time.perf_counter()
with torch.no_grad():
    model(torch.randn(2, 8))
seconds = time.perf_counter() - start
c = torch._dynamo.utils.counters
print("RESULT " + json.dumps({"seconds": seconds, "fx_hit": c["inductor"]["fxgraph_cache_hit"],
                              "fx_miss": c["inductor"]["fxgraph_cache_miss"],
                              "aot_hit": c["aot_autograd"]["autograd_cache_hit"]}))
"""


def _run(cache_dir: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, TORCHINDUCTOR_COMPILE_THREADS="1", PYTHONPATH=REPO_ROOT)
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_a_second_process_loads_the_compiled_graphs_from_the_cache(tmp_path):
    cache = str(tmp_path / "inductor")
    cold = _run(cache)
    warm = _run(cache)
    print(f"first process {cold['seconds']:.1f} s, second {warm['seconds']:.1f} s")
    assert cold["fx_miss"] > 0 and cold["fx_hit"] == 0  # compiled
    assert warm["fx_miss"] == 0 and (warm["fx_hit"] > 0 or warm["aot_hit"] > 0)  # nothing compiled again
    assert warm["seconds"] < cold["seconds"]
