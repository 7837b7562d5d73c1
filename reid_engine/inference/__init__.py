"""Using trained models: the predictor, feature extraction, feature files, rank-list figures.

Layering: this package sits above data, modeling and evaluation and beside engine (it
never imports engine). Modules, one concern each:

- `model`: an inference-ready model from a config and MODEL.WEIGHTS;
- `images`: images in any accepted form as RGB Pillow images;
- `items`: what to embed (a dataset split or an image folder);
- `extraction`: the feature module and sharded extraction (the evaluation's loop);
- `predictor`: `DefaultPredictor`, images in, embeddings out;
- `contract`: the preprocessing contract an exported model file carries;
- `exported_model`: what the back ends of exported files share (model interface, contract config);
- `onnx_runtime`: the ONNX Runtime back end (an exported .onnx file as the model);
- `openvino_runtime`: the OpenVINO back end (an exported OpenVINO IR .xml file as the model);
- `backends`: the back end names, picked from MODEL.WEIGHTS, and opening an exported file;
- `ort_session`: opening an exported .onnx file in ONNX Runtime (one-line errors);
- `feature_files`: saving and loading features with their metadata;
- `rank_lists` / `rank_figures`: rank lists, ROC curve and distance histograms.
"""
from .backends import BACKENDS, load_exported_model, resolve_backend
from .contract import CONTRACT_FILE, ContractError, DeployContract, contract_from_config, read_contract
from .exported_model import ExportedModel, contract_config
from .extraction import (
    FeatureExtractor,
    embed_images,
    extract_model_features,
    extract_shard_features,
    gather_features,
    l2_normalize,
)
from .feature_files import FEATURE_FORMATS, feature_paths, load_features, save_features
from .images import InvalidImageArrayError, as_pil_image
from .items import SPLITS, ImageFolderError, Item, collect_items, list_image_files, load_dataset
from .model import (
    PLACEHOLDER_NUM_CLASSES,
    build_inference_model,
    checkpoint_num_classes,
    inference_config,
)
from .onnx_runtime import OnnxRuntimeModel, onnx_session
from .openvino_runtime import OpenVinoModel
from .predictor import DefaultPredictor
from .rank_lists import visualize

__all__ = [
    "BACKENDS",
    "CONTRACT_FILE",
    "ContractError",
    "DeployContract",
    "ExportedModel",
    "OnnxRuntimeModel",
    "OpenVinoModel",
    "contract_config",
    "contract_from_config",
    "load_exported_model",
    "onnx_session",
    "read_contract",
    "resolve_backend",
    "DefaultPredictor",
    "FEATURE_FORMATS",
    "FeatureExtractor",
    "ImageFolderError",
    "InvalidImageArrayError",
    "Item",
    "PLACEHOLDER_NUM_CLASSES",
    "SPLITS",
    "as_pil_image",
    "build_inference_model",
    "checkpoint_num_classes",
    "collect_items",
    "embed_images",
    "extract_model_features",
    "extract_shard_features",
    "feature_paths",
    "gather_features",
    "inference_config",
    "l2_normalize",
    "list_image_files",
    "load_dataset",
    "load_features",
    "save_features",
    "visualize",
]
