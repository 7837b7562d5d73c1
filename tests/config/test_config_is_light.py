"""The config layer is light: reading and checking a config imports no torch (the run plan's machine
probes are the runtime package's)."""
import subprocess
import sys

from tests.conftest import REPO_ROOT

_IMPORT_ALL = """
import importlib, pkgutil, sys
import reid_engine.config as config
for module in pkgutil.walk_packages(config.__path__, "reid_engine.config."):
    importlib.import_module(module.name)
torch = sorted(name for name in sys.modules if name == "torch" or name.startswith("torch."))
print("torch imported: " + ", ".join(torch[:5]) if torch else "no torch")
"""


def test_every_config_module_imports_without_torch():
    run = subprocess.run([sys.executable, "-c", _IMPORT_ALL], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "no torch"
