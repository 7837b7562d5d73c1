"""Turning a gallery's inputs into items, records and features: the predictor, or a feature file.

Inputs (`collect_gallery`): a dataset split, an image folder, or a list file (see
`records.read_list_file`). Features come from a `DefaultPredictor` (a checkpoint, or an
exported ONNX / OpenVINO file through its contract: MODEL.WEIGHTS decides), through the
same extraction loop as `reid-extract`, or from a feature file that `reid-extract` wrote.
"""
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..config import CfgNode
from ..data.common import ImageReadError
from ..data.datasets.paths import IMAGE_EXTENSIONS
from ..inference import DefaultPredictor, Item, collect_items, extract_shard_features, load_features
from ..inference.contract import DeployContract
from ..utils.errors import UsageError
from .errors import QueryInputError
from .model_card import model_contract
from .records import Records, read_list_file, records_from_items

__all__ = ["Embedder", "collect_gallery", "feature_file_contract", "read_feature_file"]


def collect_gallery(cfg: CfgNode, split: str = "", dataset: str = "", image_dir: str = "",
                    list_file: str = "") -> Tuple[List[Item], Records]:
    """The items to embed and their records, from exactly one of a split, an image folder, a list file."""
    given = [bool(split), bool(image_dir), bool(list_file)]
    if sum(given) != 1:
        raise UsageError("nothing or too much to index (--split, --image-dir, --list): pass exactly one of "
                         "--split {train,query,gallery}, --image-dir DIR or --list FILE")
    if list_file:
        records = read_list_file(list_file)
        return [(str(p), int(pid), int(cam)) for p, pid, cam in zip(records.path, records.pid, records.camid)], records
    items = collect_items(cfg, split or None, dataset or None, image_dir or None)
    return items, records_from_items(items)


class Embedder:
    """A predictor with the embedding contract of its model.

    Args:
        cfg: the config (MODEL.WEIGHTS: a .pth checkpoint, or an exported .onnx / .xml file).
        source_config: the config file's name, recorded in the contract.
        predictor: an existing predictor of `cfg` to use instead of building one.
    """

    def __init__(self, cfg: CfgNode, source_config: str = "", predictor: Optional[DefaultPredictor] = None):
        self.predictor = predictor or DefaultPredictor(cfg)
        self.contract: DeployContract = model_contract(self.predictor, source_config)

    def embed_items(self, items: Sequence[Item], what: str = "Embedding the gallery") -> np.ndarray:
        """(N, D) features of dataset-style items (the evaluation's loop: progress lines with ETA)."""
        return extract_shard_features(self.predictor, list(items), what=what)[1]

    def embed_images(self, paths: Sequence[str]) -> np.ndarray:
        """(N, D) features of image files, one at a time so that a bad file is named.

        Raises:
            QueryInputError: a file that does not exist or is not a readable image.
        """
        rows = []
        for path in paths:
            if not os.path.isfile(path):
                raise QueryInputError(f"query image {path} does not exist: pass an existing "
                                      f"{'/'.join(IMAGE_EXTENSIONS)} file")
            try:
                rows.append(self.predictor(str(path)).numpy())
            except ImageReadError as e:  # its advice is about datasets; a query's fix is another file
                reason = str(e).partition("(")[2].rpartition(")")[0] or "not an image"
                raise QueryInputError(f"query image {path} cannot be read ({reason}): pass a valid image "
                                      "file") from None
        return np.concatenate(rows) if rows else np.zeros((0, int(self.contract.feature_dim)), np.float32)


def feature_file_contract(features: np.ndarray, source: str) -> DeployContract:
    """The contract of features read from a file: only their dimension (and normalization) is known."""
    return DeployContract(input_height=0, input_width=0, resize_height=0, resize_width=0,
                          feature_dim=int(features.shape[1]), source_checkpoint=os.path.basename(source),
                          meta_architecture="feature file", reid_engine_version="", contract_version=0)


def read_feature_file(path: str) -> Tuple[np.ndarray, Records]:
    """Features and records from a `reid-extract` file (.npz, or .npy + .json).

    Raises:
        QueryInputError: missing or unreadable.
    """
    if not os.path.exists(path) and not os.path.exists(os.path.splitext(path)[0] + ".json"):
        raise QueryInputError(f"feature file {path} does not exist: write one with reid-extract")
    try:
        data = load_features(path)
    except (OSError, ValueError, KeyError) as e:
        raise QueryInputError(f"feature file {path} cannot be read ({type(e).__name__}): pass a file written by "
                              "reid-extract") from None
    features = np.asarray(data["features"], dtype=np.float32)
    if features.ndim != 2:
        raise QueryInputError(f"feature file {path} holds an array of shape {features.shape}, not (N, D) features")
    records = Records.from_columns({"path": data["paths"], "pid": data["pids"], "camid": data["camids"]})
    return features, records

