"""Heads: registry, builder and EmbeddingHead."""
from .build import HEADS_REGISTRY, build_heads
from .embedding_head import EmbeddingHead

__all__ = ["HEADS_REGISTRY", "build_heads", "EmbeddingHead"]
