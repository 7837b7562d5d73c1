"""What to embed: one split of a registered dataset, or every image under a folder."""
import os
from typing import Any, List, Optional, Tuple

from ..config import CfgNode
from ..data.datasets import get_dataset, resolve_data_root
from ..data.datasets.paths import IMAGE_EXTENSIONS, list_images
from ..utils.errors import ReidUserError, UsageError

__all__ = ["SPLITS", "Item", "ImageFolderError", "list_image_files", "load_dataset", "collect_items"]

Item = Tuple[str, int, int]  # (img_path, pid, camid)
SPLITS = ("train", "query", "gallery")


class ImageFolderError(ReidUserError, FileNotFoundError):
    """The image folder to embed does not exist or holds no image."""


def list_image_files(folder: str) -> List[str]:
    """Every image file under `folder`, recursively, sorted by relative path.

    Args:
        folder: the folder to search.
    Returns:
        paths (joined onto `folder`) of files with an image extension.
    Raises:
        ImageFolderError: `folder` is not a folder, or holds no image.
    """
    if not os.path.isdir(folder):
        raise ImageFolderError(f"--image-dir {folder} is not a folder; pass a folder holding "
                               f"{'/'.join(IMAGE_EXTENSIONS)} images (sub-folders are searched too)")
    found = [path for dirpath, _, _ in os.walk(folder) for path in list_images(dirpath)]
    if not found:
        raise ImageFolderError(f"no image ({', '.join(IMAGE_EXTENSIONS)}) found under {folder}; "
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
        UsageError: no name given and DATASETS.TESTS empty, or an unknown name.
    """
    key = "--dataset"
    if not dataset_name:
        if not len(cfg.DATASETS.TESTS):
            raise UsageError("no dataset given (--dataset): pass --dataset NAME or set DATASETS.TESTS")
        dataset_name, key = cfg.DATASETS.TESTS[0], "DATASETS.TESTS"
    # an unknown name is the registry's one-line UnknownChoiceError (a usage error)
    return dataset_name, get_dataset(dataset_name, resolve_data_root(cfg.DATASETS.ROOT), key=key,
                                     split_id=cfg.DATASETS.SPLIT_ID)


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
        raise UsageError(f"unknown split {split!r} (--split): use one of {', '.join(SPLITS)}, or pass --image-dir")
    dataset_name, dataset = load_dataset(cfg, dataset_name)
    items = [tuple(item) for item in getattr(dataset, split)]
    if not items:
        raise ImageFolderError(f"the {split} split of {dataset_name} is empty; check its folder under the data root")
    return items
