"""The embedding contract an index keeps: which model made its features, and how.

It is the deployment contract (`inference.contract.DeployContract`) of the model: for a
checkpoint the one `reid-export` would write (model, preprocessing, feature dimension,
normalization, the checkpoint's sha256), for an exported ONNX / OpenVINO file the one the
file carries. An exported file of the checkpoint an index was built with therefore
matches it: both name the same checkpoint checksum and preprocessing.
"""
from typing import Mapping

import numpy as np

from ..inference.contract import DeployContract, contract_from_config
from .errors import ModelMismatchError

__all__ = ["IDENTITY_FIELDS", "model_contract", "describe_model", "check_same_model", "check_feature_dim"]

#: the contract entries that must agree for two embeddings to be comparable
IDENTITY_FIELDS = ("meta_architecture", "backbone", "source_checkpoint_sha256", "feature_dim", "normalized_features",
                   "flip_averaged", "input_height", "input_width", "resize_height", "resize_width", "interpolation",
                   "pixel_mean", "pixel_std")


def model_contract(predictor, source_config: str = "") -> DeployContract:
    """The contract of a `DefaultPredictor`'s embeddings (probing one image for the feature dimension)."""
    contract = getattr(predictor.model, "contract", None)
    if contract is not None:  # an exported file: its own contract
        return contract
    height, width = (int(v) for v in predictor.cfg.INPUT.SIZE_TEST)
    dim = int(predictor(np.zeros((height, width, 3), dtype=np.uint8)).shape[1])
    return contract_from_config(predictor.cfg, dim, source_config=source_config)


def describe_model(contract: Mapping[str, str]) -> str:
    """A short name of a model: architecture, backbone, checkpoint and checksum prefix, dimension."""
    sha = contract.get("source_checkpoint_sha256", "") or "no checksum"
    return (f"{contract.get('meta_architecture', '?')} {contract.get('backbone', '?')} from "
            f"{contract.get('source_checkpoint', '') or '?'} (sha256 {sha[:12]}), {contract.get('feature_dim')}-d")


def check_same_model(index_contract: Mapping[str, str], query_contract: Mapping[str, str], what: str = "query") -> None:
    """Refuse embeddings of another model than the index's (one line naming both).

    Raises:
        ModelMismatchError: an identity field (`IDENTITY_FIELDS`) differs.
    """
    differ = [k for k in IDENTITY_FIELDS if str(index_contract.get(k, "")) != str(query_contract.get(k, ""))]
    if differ:
        raise ModelMismatchError(
            f"the {what} model {describe_model(query_contract)} is not the index's model "
            f"{describe_model(index_contract)} (they differ in {', '.join(differ)}): use the index's model "
            "(reid-index info shows it) or build a new index with this one")


def check_feature_dim(index_contract: Mapping[str, str], dim: int, source: str) -> None:
    """Refuse features whose dimension is not the index's (one line naming both)."""
    expected = int(index_contract["feature_dim"])
    if int(dim) != expected:
        raise ModelMismatchError(
            f"{source} holds {dim}-d features but the index holds {expected}-d features of "
            f"{describe_model(index_contract)}: embed the queries with the index's model")
