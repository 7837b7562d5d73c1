"""Shared pieces of the "using trained models" tools.

`DefaultPredictor`, `tools/extract_features.py`, `tools/visualize_ranks.py` and
`tools/export.py` all need the same few things: an inference-ready model built from a
config and MODEL.WEIGHTS, images in any of the accepted forms, the items of a dataset
split or an image folder, a sharded loader over them, and progress lines. They live
here once.
"""
import importlib
import json
import logging
import os
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from ..config import CfgNode, ConfigError
from ..data import ImageReadError, build_reid_inference_loader, read_image
from ..data.datasets import DatasetFormatError, get_dataset, resolve_data_root
from ..data.datasets.paths import IMAGE_EXTENSIONS
from ..evaluation import DatasetEvaluator, inference_on_dataset
from ..evaluation.rank import NoValidQueryError
from ..modeling import build_model
from ..utils import comm
from ..utils.checkpoint import Checkpointer, CheckpointError, load_checkpoint_file
from ..utils.file_io import atomic_write, atomic_write_text

__all__ = [
    "SPLITS",
    "PLACEHOLDER_NUM_CLASSES",
    "Item",
    "checkpoint_num_classes",
    "inference_config",
    "build_inference_model",
    "as_pil_image",
    "l2_normalize",
    "FeatureExtractor",
    "embed_images",
    "list_image_files",
    "load_dataset",
    "collect_items",
    "extract_shard_features",
    "gather_features",
    "FEATURE_FORMATS",
    "feature_paths",
    "save_features",
    "load_features",
    "ToolError",
    "TOOL_ERRORS",
    "require_module",
    "run_tool",
]

logger = logging.getLogger(__name__)

Item = Tuple[str, int, int]  # (img_path, pid, camid)
SPLITS = ("train", "query", "gallery")
# Class count used when neither the config nor the checkpoint gives one; the classifier
# is not used at inference, so any positive value builds a working model.
PLACEHOLDER_NUM_CLASSES = 1
_CLASSIFIER_KEY = "heads.weight"


class ToolError(ValueError):
    """A bad tool argument or an impossible request; the message says what to change."""


# --------------------------------------------------------------------------- the model


def checkpoint_num_classes(path: str) -> Optional[int]:
    """Read the number of training classes from a checkpoint's classifier weight.

    The file is read with the same safe loader the Checkpointer uses (no code runs).

    Args:
        path: a checkpoint file (ours, fast-reid's, or a bare state dict).
    Returns:
        rows of the ``heads.weight`` entry (a ``module.`` prefix is allowed), or None
        when the checkpoint has no such entry.
    """
    state = load_checkpoint_file(path)["model"]
    for key, value in state.items():
        if (key == _CLASSIFIER_KEY or key.endswith("." + _CLASSIFIER_KEY)) and value.ndim == 2:
            return int(value.shape[0])
    return None


def inference_config(cfg: CfgNode) -> CfgNode:
    """Return a frozen copy of `cfg` fit for building an inference model.

    MODEL.BACKBONE.PRETRAIN is switched off (the weights come from MODEL.WEIGHTS), and
    a MODEL.HEADS.NUM_CLASSES of 0 is filled from the checkpoint's classifier (so the
    whole checkpoint loads without shape warnings), else with a placeholder.

    Args:
        cfg: the user's config (not modified).
    Returns:
        the adjusted, frozen clone.
    """
    cfg = cfg.clone()
    cfg.defrost()
    cfg.MODEL.BACKBONE.PRETRAIN = False
    if cfg.MODEL.HEADS.NUM_CLASSES <= 0:
        found = checkpoint_num_classes(cfg.MODEL.WEIGHTS) if cfg.MODEL.WEIGHTS else None
        cfg.MODEL.HEADS.NUM_CLASSES = found or PLACEHOLDER_NUM_CLASSES
    cfg.freeze()
    return cfg


def build_inference_model(cfg: CfgNode) -> nn.Module:
    """Build the model of `cfg`, load MODEL.WEIGHTS and switch it to eval mode.

    Args:
        cfg: the config (MODEL.* and INPUT.SIZE_TEST are read by the model builder).
    Returns:
        the model on MODEL.DEVICE, in eval mode, without gradients.
    """
    cfg = inference_config(cfg)
    model = build_model(cfg)
    if cfg.MODEL.WEIGHTS:
        Checkpointer(model).load(cfg.MODEL.WEIGHTS, checkpointables=[])
    else:
        logger.warning("MODEL.WEIGHTS is empty: the model keeps its random initial weights; "
                       "pass MODEL.WEIGHTS path/to/model_final.pth for meaningful features")
    model.eval()
    model.requires_grad_(False)
    return model


# --------------------------------------------------------------------------- images


def as_pil_image(image: Any, draft_size: Optional[Tuple[int, int]] = None) -> Image.Image:
    """Turn one input image into an RGB Pillow image.

    Args:
        image: a file path (str or os.PathLike), a Pillow image (any mode), or an
            (H, W, 3) uint8 numpy array in RGB order.
        draft_size: ``(width, height)`` the image will be resized to; lets JPEG files
            decode at a reduced scale.
    Returns:
        an RGB ``PIL.Image.Image``.
    Raises:
        reid_engine.data.ImageReadError: an unreadable file (the message names it).
        TypeError / ValueError: another type, or an array of the wrong shape or dtype.
    """
    if isinstance(image, (str, os.PathLike)):
        return read_image(os.fspath(image), draft_size)
    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else image.convert("RGB")
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"image arrays must have shape (H, W, 3) in RGB order, got {image.shape}; "
                             "convert grey images with np.stack([a] * 3, axis=-1)")
        if image.dtype != np.uint8:
            raise ValueError(f"image arrays must be uint8 (0..255), got {image.dtype}; "
                             "use (a * 255).round().astype(np.uint8) for 0..1 floats")
        return Image.fromarray(np.ascontiguousarray(image), mode="RGB")
    raise TypeError(f"unsupported image type {type(image).__name__}: pass a file path, a PIL image "
                    "or an (H, W, 3) uint8 RGB numpy array")


def l2_normalize(features: torch.Tensor) -> torch.Tensor:
    """Return float32 rows of unit L2 norm (zero rows stay zero)."""
    return F.normalize(features.float(), dim=1)


class FeatureExtractor(nn.Module):
    """The inference model as one module: image batch in, feature batch out.

    Input: (B, 3, H, W) RGB images with values 0..255, uint8 or float (the model
    normalises them with MODEL.PIXEL_MEAN / PIXEL_STD). Output: (B, D) float32 features,
    L2-normalised when `normalize` (what retrieval with the cosine metric uses), else
    the model's raw features. This is also the module the export tool exports.

    Args:
        model: an eval-mode model mapping images to (B, D) features.
        normalize: L2-normalise the features.
        flip: average in the features of the horizontally mirrored images
            (TEST.FLIP.ENABLED in evaluation).
    """

    def __init__(self, model: nn.Module, normalize: bool = True, flip: bool = False):
        super().__init__()
        self.model = model
        self.train(model.training)  # follow the wrapped model's mode (exporters restore it)
        self.normalize = bool(normalize)
        self.flip = bool(flip)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.model(images).float()
        if self.flip:
            features = (features + self.model(images.flip(dims=[3])).float()) / 2
        return l2_normalize(features) if self.normalize else features


@torch.inference_mode()
def embed_images(model: nn.Module, images: torch.Tensor, flip: bool = False) -> torch.Tensor:
    """Run the model on one batch and return normalised float32 CPU features.

    Args:
        model: an eval-mode model mapping (B, 3, H, W) 0..255 images to (B, D) features.
        images: uint8 (or float 0..255) batch on any device.
        flip: also embed the mirrored images and average the two features, as the
            evaluation does with TEST.FLIP.ENABLED.
    Returns:
        (B, D) float32 CPU tensor of unit-norm rows.
    """
    images = images.to(model.device, non_blocking=True)
    return FeatureExtractor(model, normalize=True, flip=flip)(images).cpu()


# --------------------------------------------------------------------------- items


def list_image_files(folder: str) -> List[str]:
    """Every image file under `folder`, recursively, sorted by relative path.

    Args:
        folder: the folder to search.
    Returns:
        paths (joined onto `folder`) of files with an image extension.
    Raises:
        FileNotFoundError: `folder` is not a folder, or holds no image.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--image-dir {folder} is not a folder; pass a folder holding "
                                f"{'/'.join(IMAGE_EXTENSIONS)} images (sub-folders are searched too)")
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        found.extend(os.path.join(dirpath, n) for n in filenames if n.lower().endswith(IMAGE_EXTENSIONS))
    if not found:
        raise FileNotFoundError(f"no image ({', '.join(IMAGE_EXTENSIONS)}) found under {folder}; "
                                "check the path passed to --image-dir")
    # Sorting relative paths with "/" separators gives the same order on every OS.
    return sorted(found, key=lambda p: os.path.relpath(p, folder).replace(os.sep, "/"))


def load_dataset(cfg: CfgNode, dataset_name: Optional[str] = None) -> Tuple[str, Any]:
    """Load a registered dataset from DATASETS.ROOT.

    Args:
        cfg: the config (DATASETS.ROOT; DATASETS.TESTS[0] when no name is given).
        dataset_name: a registered name (e.g. "Market1501").
    Returns:
        (the name used, the dataset with ``train`` / ``query`` / ``gallery`` item lists).
    Raises:
        ToolError: no name given and DATASETS.TESTS empty, or an unknown name.
    """
    if not dataset_name:
        if not len(cfg.DATASETS.TESTS):
            raise ToolError("no dataset given: pass --dataset NAME or set DATASETS.TESTS")
        dataset_name = cfg.DATASETS.TESTS[0]
    try:
        return dataset_name, get_dataset(dataset_name, resolve_data_root(cfg.DATASETS.ROOT))
    except KeyError as e:  # the registry's "unknown dataset ..." message, without KeyError's quotes
        raise ToolError(str(e.args[0]) if e.args else str(e)) from None


def collect_items(cfg: CfgNode, split: Optional[str] = None, dataset_name: Optional[str] = None,
                  image_dir: Optional[str] = None) -> List[Item]:
    """The items to process: one split of a registered dataset, or an image folder.

    Args:
        cfg: the config (DATASETS.ROOT; DATASETS.TESTS[0] when no dataset is named).
        split: "train", "query" or "gallery" (with a dataset). Train pids are the
            relabelled training ids (0..N-1), query and gallery keep the original ids.
        dataset_name: a registered dataset name (default: the first of DATASETS.TESTS).
        image_dir: a folder of images instead of a dataset (pid and camid are then -1).
    Returns:
        list of ``(img_path, pid, camid)`` in the dataset's (or sorted path) order.
    """
    if image_dir:
        return [(path, -1, -1) for path in list_image_files(image_dir)]
    if split not in SPLITS:
        raise ToolError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}, or pass --image-dir")
    dataset_name, dataset = load_dataset(cfg, dataset_name)
    items = [tuple(item) for item in getattr(dataset, split)]
    if not items:
        raise ToolError(f"the {split} split of {dataset_name} is empty; check its folder under the data root")
    return items


# --------------------------------------------------------------------------- features


class _FeatureCollector(DatasetEvaluator):
    """Keeps each batch's model outputs as L2-normalised float32 CPU rows, in order."""

    def reset(self) -> None:
        self._chunks: List[torch.Tensor] = []

    def process(self, inputs, outputs) -> None:
        self._chunks.append(l2_normalize(outputs.float()).cpu())

    def evaluate(self) -> np.ndarray:
        return torch.cat(self._chunks).numpy() if self._chunks else np.zeros((0, 0), dtype=np.float32)


def extract_shard_features(predictor, items: Sequence[Item], what: str = "Extracting features"
                           ) -> Tuple[int, np.ndarray]:
    """Embed this worker's contiguous shard of `items` (all of them in a single process).

    Runs the evaluation's inference loop (`inference_on_dataset`: eval mode, flip test,
    progress lines with images/s and ETA) with the predictor's model and transforms.

    Args:
        predictor: a `DefaultPredictor` (its config, model, test transforms and flip flag).
        items: all items of the job, in order.
        what: first words of the progress lines.
    Returns:
        ``(begin, features)``: index of the shard's first item and its (n, D) float32
        features of unit norm, in item order (n may be 0 when there are more workers
        than items; D is then 0 too).
    """
    loader = build_reid_inference_loader(predictor.cfg, items, predictor.transforms)
    world = comm.get_world_size()
    label = f"{what} (worker {comm.get_rank()} of {world})" if world > 1 else what
    features = inference_on_dataset(predictor.model, loader, _FeatureCollector(), flip_test=predictor.flip,
                                    progress_label=label)
    return loader.batch_sampler.sampler.begin, features


def gather_features(begin: int, features: np.ndarray, total: int) -> Optional[np.ndarray]:
    """Collect every worker's shard on the main process, in item order.

    Args:
        begin: the index of this shard's first item.
        features: this shard's (n, D) features.
        total: the number of items of the whole job.
    Returns:
        the (total, D) features on the main process; None on the others.
    """
    shards = comm.gather((begin, features))
    if not comm.is_main_process():
        return None
    shards = sorted((b, f) for b, f in shards if len(f))
    expected = 0
    for b, f in shards:  # the shards must tile 0..total exactly
        if b != expected:
            raise RuntimeError(f"internal error: feature shards do not tile the items (gap at {expected})")
        expected += len(f)
    if expected != total:
        raise RuntimeError(f"internal error: gathered {expected} features for {total} items")
    return np.concatenate([f for _, f in shards]).astype(np.float32, copy=False)


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
        raise ToolError(f"unknown feature format {fmt!r}; use one of {', '.join(FEATURE_FORMATS)}")
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
        items: the N ``(img_path, pid, camid)`` items.
        fmt: "npz" or "npy".
        source: what was embedded (e.g. "Market1501/query").
    Returns:
        the files written.
    """
    if len(features) != len(items):
        raise ValueError(f"{len(features)} feature rows for {len(items)} items")
    feature_file, index_file = feature_paths(output, fmt)
    features = np.ascontiguousarray(features, dtype=np.float32)
    paths = [str(p) for p, _, _ in items]
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


# --------------------------------------------------------------------------- command-line errors


# Errors whose message already says what is wrong and how to fix it: a tool prints that
# one line instead of a traceback.
TOOL_ERRORS = (ConfigError, ToolError, FileNotFoundError, NotADirectoryError, ImageReadError,
               CheckpointError, DatasetFormatError, NoValidQueryError)


def require_module(name: str, purpose: str, package: Optional[str] = None):
    """Import an optional dependency, or fail with a one-line install hint.

    Args:
        name: the module to import (e.g. "matplotlib").
        purpose: what needs it (for the message).
        package: the pip package name when it differs from `name`.
    Returns:
        the imported module.
    Raises:
        ToolError: the module is not installed.
    """
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ToolError(f"{purpose} needs {name}, which is not installed: pip install {package or name}") from None


def run_tool(prog: str, func: Callable[..., Any], *args: Any) -> int:
    """Run a tool's body; a user error becomes one ``<prog>: error: ...`` line on stderr.

    Args:
        prog: the tool's name, first word of the error line.
        func: the body.
        args: its arguments.
    Returns:
        the process exit code: 0 on success, 2 on a user error.
    """
    try:
        func(*args)
    except TOOL_ERRORS as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0
