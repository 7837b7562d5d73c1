"""Images to features: the feature module, one-batch embedding, and sharded extraction.

Extraction over many images runs the evaluation's inference loop
(`evaluation.inference_on_dataset`) with a collecting evaluator, and flip averaging is
`evaluation.flip_averaged`, so features match those the evaluation computes.
"""
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data import build_reid_inference_loader
from ..evaluation import DatasetEvaluator, flip_averaged, inference_on_dataset
from ..utils import comm
from .items import Item

__all__ = ["l2_normalize", "FeatureExtractor", "embed_images", "extract_shard_features", "extract_model_features",
           "gather_features"]


def l2_normalize(features: torch.Tensor) -> torch.Tensor:
    """Return float32 rows of unit L2 norm (zero rows stay zero)."""
    return F.normalize(features.float(), dim=1)


class FeatureExtractor(nn.Module):
    """The inference model as one module: image batch in, feature batch out.

    Input: (B, 3, H, W) RGB images with values 0..255, uint8 or float (the model
    normalizes them with MODEL.PIXEL_MEAN / PIXEL_STD). Output: (B, D) float32 features,
    L2-normalized when `normalize` (what retrieval with the cosine metric uses), else
    the model's raw features. This is also the module `reid_engine.export` exports.

    Args:
        model: an eval-mode model mapping images to (B, D) features.
        normalize: L2-normalize the features.
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
        features = (flip_averaged(self.model, images) if self.flip else self.model(images)).float()
        return l2_normalize(features) if self.normalize else features


@torch.inference_mode()
def embed_images(model: nn.Module, images: torch.Tensor, flip: bool = False) -> torch.Tensor:
    """Run the model on one batch and return normalized float32 CPU features.

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


class _FeatureCollector(DatasetEvaluator):
    """Keeps each batch's model outputs as L2-normalized float32 CPU rows, in order."""

    def reset(self) -> None:
        self._chunks: List[torch.Tensor] = []

    def process(self, inputs, outputs) -> None:
        self._chunks.append(l2_normalize(outputs.float()).cpu())

    def evaluate(self) -> np.ndarray:
        return torch.cat(self._chunks).numpy() if self._chunks else np.zeros((0, 0), dtype=np.float32)


def extract_shard_features(predictor, items: Sequence[Item], what: str = "Extracting features",
                           cache=None) -> Tuple[int, np.ndarray]:
    """Embed this worker's contiguous shard of `items` with a predictor (all of them in a single process).

    :func:`extract_model_features` with the predictor's config, model, test transforms and flip flag.

    Args:
        predictor: a `DefaultPredictor`.
        items, what, cache: as :func:`extract_model_features`.
    Returns:
        ``(begin, features)``, as :func:`extract_model_features`.
    """
    return extract_model_features(predictor.cfg, predictor.model, items, transforms=predictor.transforms,
                                  flip=predictor.flip, what=what, cache=cache)


def extract_model_features(cfg, model: nn.Module, items: Sequence[Item], *, transforms=None, flip: bool = False,
                           what: str = "Extracting features", cache=None) -> Tuple[int, np.ndarray]:
    """Embed this worker's contiguous shard of `items` with `model` (all of them in a single process).

    Runs the evaluation's inference loop (`inference_on_dataset`: eval mode, flip test,
    progress lines with images/s and ETA), so the features are those the evaluation computes.

    Args:
        cfg: the config of the loader (TEST.IMS_PER_BATCH, DATALOADER.NUM_WORKERS, INPUT.* of the
            default test transforms).
        model: the model (a training model too: the loop runs it in eval mode, then restores its mode).
        items: all items of the job, in order: images, or ``(frame paths, pid, camid)``
            tracklets (one feature each, the model's pooling of the TEST.SAMPLE_METHOD frames).
        transforms: the image pipeline (default: the test transforms of `cfg`).
        flip: average in the features of the mirrored images (TEST.FLIP.ENABLED).
        what: first words of the progress lines.
        cache: an image cache to read from where it holds the test pipeline's prefix (see
            ``build_reid_inference_loader``), or None.
    Returns:
        ``(begin, features)``: index of the shard's first item and its (n, D) float32
        features of unit norm, in item order (n may be 0 when there are more workers
        than items; D is then 0 too).
    """
    loader = build_reid_inference_loader(cfg, items, transforms, cache=cache)
    world = comm.get_world_size()
    label = f"{what} (worker {comm.get_rank()} of {world})" if world > 1 else what
    features = inference_on_dataset(model, loader, _FeatureCollector(), flip_test=flip, progress_label=label)
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
