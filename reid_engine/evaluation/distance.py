"""Query x gallery distances, computed one chunk of query rows at a time.

Two metrics (reid-protocol.md): ``cosine`` = 1 - cos(q, g) on L2-normalised features
and ``euclidean`` = squared L2 distance. Chunking keeps memory at one
``chunk x gallery`` block, so callers can stream rows into the metrics without
ever holding the full matrix.
"""
from typing import Iterator, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from reid_engine.utils.registry import check_choice

__all__ = [
    "METRICS",
    "check_metric",
    "all_finite",
    "as_feature_tensor",
    "prepare_gallery",
    "distance_chunk",
    "iter_distance_chunks",
    "compute_distance_matrix",
    "default_chunk_size",
]

METRICS = ("cosine", "euclidean")

# Elements of one chunk x gallery block; ~16M keeps each float32 block near 64 MB.
_CHUNK_ELEMENTS = 1 << 24


def default_chunk_size(num_gallery: int, elements: int = _CHUNK_ELEMENTS) -> int:
    """Return a number of query rows whose ``rows x num_gallery`` block has about `elements` entries.

    Args:
        num_gallery: gallery size (columns of the block).
        elements: target block size in elements.

    Returns:
        int: at least 1.
    """
    return max(1, elements // max(1, int(num_gallery)))


def check_metric(metric: str) -> str:
    """Return ``metric`` if it is one of :data:`METRICS`, else raise a one-line UnknownChoiceError (TEST.METRIC)."""
    return check_choice(metric, METRICS, "TEST.METRIC")


def all_finite(values: torch.Tensor) -> bool:
    """True when no entry of `values` is NaN or inf, without full-size temporaries.

    A sum is finite iff every entry is, unless finite values overflow it; only then
    are rows checked exactly, a block at a time.
    """
    if bool(torch.isfinite(values.sum())):
        return True
    rows = values.reshape(len(values), -1) if values.dim() else values.reshape(1, 1)
    step = default_chunk_size(rows.shape[1])
    return all(bool(torch.isfinite(rows[s:s + step]).all()) for s in range(0, rows.shape[0], step))


def as_feature_tensor(feats, name: str = "features") -> torch.Tensor:
    """Return `feats` (numpy array or tensor, shape (N, D)) as a floating tensor.

    Float16/bfloat16 stay as they are on CUDA (half-precision matmul there) and are
    widened to float32 on CPU, where half matmuls are slow or missing.

    Args:
        feats: features, one row per image.
        name: used in error messages.

    Returns:
        torch.Tensor: (N, D) floating tensor (no copy when already suitable).
    """
    t = torch.as_tensor(feats) if isinstance(feats, np.ndarray) else feats
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(feats).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must have shape (N, D), got {tuple(t.shape)}")
    t = t.detach()
    if not t.is_floating_point():
        t = t.float()
    if t.dtype in (torch.float16, torch.bfloat16) and t.device.type != "cuda":
        t = t.float()
    if not all_finite(t):
        raise ValueError(f"{name} contain NaN or inf values; check the model outputs (e.g. a diverged training run)")
    return t


def _matmul_float32(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """``a @ b_t`` as float32; half inputs on CUDA accumulate and return in float32."""
    if a.dtype in (torch.float16, torch.bfloat16):
        try:
            return torch.mm(a, b_t, out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):  # older torch: no out_dtype
            return torch.mm(a, b_t).float()
    return torch.mm(a, b_t)


def prepare_gallery(gallery: torch.Tensor, metric: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Precompute what every chunk needs from the gallery.

    Args:
        gallery: (G, D) features.
        metric: "cosine" or "euclidean".

    Returns:
        (gallery_t, gallery_term): the transposed gallery (D, G) for the matmul and a
        (G,) float32 vector: inverse norms for cosine, squared norms for euclidean.
    """
    check_metric(metric)
    norms = gallery.float().norm(dim=1)
    if metric == "cosine":
        term = 1.0 / norms.clamp_min(1e-12)
    else:
        term = norms.pow(2)
    return gallery.t(), term


def distance_chunk(query: torch.Tensor, gallery_t: torch.Tensor, gallery_term: torch.Tensor, metric: str) -> torch.Tensor:
    """Distances from a block of query rows to the whole gallery.

    Args:
        query: (C, D) query features.
        gallery_t, gallery_term: from :func:`prepare_gallery`.
        metric: "cosine" or "euclidean".

    Returns:
        torch.Tensor: (C, G) float32 distances.
    """
    if metric == "cosine":
        # Normalising the small query block and scaling the product by the gallery's
        # inverse norms avoids a normalised copy of the (large) gallery.
        q = F.normalize(query.float(), dim=1).to(query.dtype)
        dist = _matmul_float32(q, gallery_t)
        dist.mul_(gallery_term.neg().unsqueeze(0)).add_(1.0)
        return dist
    q_sq = query.float().pow(2).sum(dim=1, keepdim=True)
    dist = _matmul_float32(query, gallery_t)
    dist.mul_(-2.0).add_(gallery_term.unsqueeze(0)).add_(q_sq)
    return dist.clamp_min_(0.0)  # rounding can give tiny negatives


def iter_distance_chunks(
    query, gallery, metric: str = "cosine", chunk_size: Optional[int] = None
) -> Iterator[Tuple[int, torch.Tensor]]:
    """Yield ``(start_row, distances)`` blocks of the query x gallery distance matrix.

    Args:
        query: (Q, D) features (tensor or numpy).
        gallery: (G, D) features on the same device.
        metric: "cosine" (1 - cos) or "euclidean" (squared L2).
        chunk_size: query rows per block (default: about 16M elements per block).

    Yields:
        (int, torch.Tensor): first query row of the block and its (C, G) float32 distances.
    """
    check_metric(metric)
    query = as_feature_tensor(query, "query features")
    gallery = as_feature_tensor(gallery, "gallery features")
    if query.shape[1] != gallery.shape[1]:
        raise ValueError(
            f"query features have dimension {query.shape[1]} but gallery features {gallery.shape[1]}; "
            "both must come from the same model"
        )
    gallery = gallery.to(device=query.device, dtype=query.dtype)
    chunk = chunk_size or default_chunk_size(gallery.shape[0])
    gallery_t, term = prepare_gallery(gallery, metric)
    for start in range(0, query.shape[0], chunk):
        yield start, distance_chunk(query[start:start + chunk], gallery_t, term, metric)


def compute_distance_matrix(query, gallery, metric: str = "cosine", chunk_size: Optional[int] = None) -> torch.Tensor:
    """Return the full (Q, G) float32 distance matrix (built chunk by chunk).

    Args:
        query, gallery: (Q, D) and (G, D) features.
        metric: "cosine" or "euclidean".
        chunk_size: query rows per block.

    Returns:
        torch.Tensor: (Q, G) distances on the features' device.
    """
    blocks = [d for _, d in iter_distance_chunks(query, gallery, metric, chunk_size)]
    if not blocks:
        g = as_feature_tensor(gallery, "gallery features")
        return torch.empty(0, g.shape[0], device=g.device)
    return torch.cat(blocks, dim=0)
