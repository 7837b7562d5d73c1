"""Feature files: features with their image paths, pids, camids and source, as npz or npy + json."""
import json
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..data.tracklets import is_tracklet_item
from ..utils.errors import UsageError
from ..utils.file_io import atomic_write, atomic_write_text
from .items import Item

__all__ = ["FEATURE_FORMATS", "feature_paths", "save_features", "load_features"]

FEATURE_FORMATS = ("npz", "npy")


def feature_paths(output: str, fmt: str) -> Tuple[str, Optional[str]]:
    """The file(s) a feature file of format `fmt` is written to.

    Args:
        output: the requested path (its extension may be left out).
        fmt: "npz" (one file) or "npy" (features ``.npy`` + index ``.json``).
    Returns:
        (feature file, index file or None).
    """
    if fmt not in FEATURE_FORMATS:
        raise UsageError(f"unknown feature format {fmt!r} (--format): use one of {', '.join(FEATURE_FORMATS)}")
    stem, ext = os.path.splitext(output)
    if ext.lower() not in (".npz", ".npy", ".json"):
        stem = output
    if fmt == "npz":
        return stem + ".npz", None
    return stem + ".npy", stem + ".json"


def save_features(output: str, features: np.ndarray, items: Sequence[Item], fmt: str = "npz",
                  source: str = "") -> List[str]:
    """Write features with their paths, pids and camids (atomically).

    "npz": one ``.npz`` with arrays ``features`` (N, D) float32, ``paths`` (N,) str,
    ``pids`` and ``camids`` (N,) int64 and ``source`` (a 0-d str). "npy": the features
    as ``.npy`` plus a ``.json`` index ``{"source", "num_images", "feature_dim",
    "features_file", "paths", "pids", "camids"}``. Row i belongs to ``items[i]``.

    Args:
        output: destination path (the extension is set from `fmt`).
        features: (N, D) features.
        items: the N ``(img_path, pid, camid)`` items, or ``(frame paths, pid, camid)``
            tracklets (a tracklet's path is its first frame).
        fmt: "npz" or "npy".
        source: what was embedded (e.g. "Market1501/query").
    Returns:
        the files written.
    """
    if len(features) != len(items):
        raise UsageError(f"{len(features)} feature rows for {len(items)} items: pass one row per item")
    feature_file, index_file = feature_paths(output, fmt)
    features = np.ascontiguousarray(features, dtype=np.float32)
    # A tracklet is named by its first frame, as the evaluation's batches name it (img_path).
    paths = [str(item[0][0] if is_tracklet_item(item) else item[0]) for item in items]
    pids = np.asarray([int(p) for _, p, _ in items], dtype=np.int64)
    camids = np.asarray([int(c) for _, _, c in items], dtype=np.int64)
    if fmt == "npz":
        atomic_write(feature_file, lambda f: np.savez(
            f, features=features, paths=np.asarray(paths, dtype=str), pids=pids, camids=camids,
            source=np.asarray(source)))
        return [feature_file]
    index = {"source": source, "num_images": len(items), "feature_dim": int(features.shape[1]),
             "features_file": os.path.basename(feature_file), "paths": paths,
             "pids": pids.tolist(), "camids": camids.tolist()}
    atomic_write(feature_file, lambda f: np.save(f, features))
    atomic_write_text(index_file, json.dumps(index, indent=1) + "\n")
    return [feature_file, index_file]


def load_features(path: str) -> dict:
    """Read a file written by :func:`save_features` (either format).

    Args:
        path: the ``.npz`` file, or the ``.npy`` / ``.json`` of the other format.
    Returns:
        dict with "features" (N, D) float32, "paths" list[str], "pids" and "camids"
        (N,) int64 arrays, and "source" str.
    """
    stem, ext = os.path.splitext(path)
    if ext.lower() == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return {"features": data["features"], "paths": data["paths"].tolist(), "pids": data["pids"],
                    "camids": data["camids"], "source": str(data["source"])}
    with open(stem + ".json", encoding="utf-8") as f:
        index = json.load(f)
    features = np.load(os.path.join(os.path.dirname(stem), index["features_file"]), allow_pickle=False)
    return {"features": features, "paths": index["paths"], "pids": np.asarray(index["pids"], dtype=np.int64),
            "camids": np.asarray(index["camids"], dtype=np.int64), "source": index["source"]}
