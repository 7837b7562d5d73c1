"""A table describing the software and hardware environment, for logs and bug reports.

Run ``python -m reid_engine.utils.collect_env`` to print it.
"""

import importlib
import os
import sys
from collections import defaultdict
from typing import List, Tuple

import numpy as np
import torch
from tabulate import tabulate

__all__ = ["collect_env_info"]

# Libraries reported by version; each is optional at run time.
_LIBRARIES = ("PIL", "fvcore", "yacs", "tensorboardX", "tabulate")
_DISPLAY_NAMES = {"PIL": "Pillow"}


def _module_version(module_name: str) -> str:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return "not installed"
    return str(getattr(module, "__version__", "unknown"))


def _package_rows() -> List[Tuple[str, str]]:
    try:
        import reid_engine

        version = str(getattr(reid_engine, "__version__", "unknown"))
        path = os.path.dirname(os.path.abspath(reid_engine.__file__ or next(iter(reid_engine.__path__))))
    except ImportError:
        return [("reid_engine", "failed to import")]
    return [("reid_engine", f"{version} @{path}")]


def _cuda_rows() -> List[Tuple[str, str]]:
    available = torch.cuda.is_available()
    rows = [("CUDA available", str(available))]
    if not available:
        return rows
    rows.append(("CUDA version (torch build)", str(torch.version.cuda)))
    rows.append(("cuDNN", str(torch.backends.cudnn.version())))
    devices = defaultdict(list)  # same model -> one row listing the device indices
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices[f"{props.name} (arch {props.major}.{props.minor})"].append(str(index))
    for name, indices in devices.items():
        rows.append((f"GPU {','.join(indices)}", name))
    rows.append(("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "<not set>")))
    return rows


def collect_env_info() -> str:
    """Return a two-column table (tabulate) of platform, Python, library versions,
    CUDA / GPU details and the CPU count."""
    rows = [
        ("sys.platform", sys.platform),
        ("Python", sys.version.replace("\n", " ")),
        ("numpy", np.__version__),
    ]
    rows += _package_rows()
    rows.append(("PyTorch", f"{torch.__version__} @{os.path.dirname(torch.__file__)}"))
    rows.append(("PyTorch debug build", str(torch.version.debug)))
    rows += _cuda_rows()
    rows += [(_DISPLAY_NAMES.get(name, name), _module_version(name)) for name in _LIBRARIES]
    rows.append(("CPU count", str(os.cpu_count())))
    return tabulate(rows)


if __name__ == "__main__":
    print(collect_env_info())
