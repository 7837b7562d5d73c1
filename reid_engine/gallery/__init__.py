"""Person search: a persistent gallery index of embeddings, built once and queried by image.

Layering: above inference and evaluation (layer 4); only cli imports it. Modules, one job each:

- `records`: item metadata (path, pid, camid, time, trackid), list files;
- `filters`: metadata conditions, as a mask (faiss) or a Milvus expression;
- `model_card`: the embedding contract an index keeps, and the model / dimension checks;
- `planner`: which index (exact, IVF, HNSW) for a gallery size and recall target, and its tuning;
- `index`: `GalleryIndex`, the API both back ends implement;
- `faiss_backend` / `milvus_backend`: the embedded (one file) and the Milvus back end;
- `backends`: creating and opening an index by back end and location;
- `embedding`: inputs to items and features (predictor, exported file, feature file);
- `build`: resumable build and add;
- `search`: search with filters and re-ranking, rank-list pictures;
- `evaluation`: mAP / CMC through the index, recall@k of the approximate index.
"""
from .backends import INDEX_BACKENDS, MILVUS_TOKEN_ENV, MILVUS_URI_ENV, Location, create_index, open_index
from .build import DEFAULT_CHUNK, add_to_index, build_index, embed_resumable, stop_on_sigterm
from .embedding import Embedder, collect_gallery, feature_file_contract, read_feature_file
from .errors import (
    BackendUnreachableError,
    BuildStopped,
    IndexFileError,
    ModelMismatchError,
    QueryInputError,
    UnknownFieldError,
)
from .evaluation import approximate_recall, evaluate_with_index
from .filters import SearchFilter, parse_where, query_filter
from .index import GalleryIndex, Manifest, SearchResult
from .model_card import check_same_model, model_contract
from .planner import DEFAULT_RECALL_TARGET, EXACT_MAX_ITEMS, INDEX_KINDS, IndexPlan, plan_index, recall_at_k
from .records import FIELDS, Records, read_list_file, records_from_items
from .search import DEFAULT_RERANK_CANDIDATES, draw_results, search_index

__all__ = [
    "BackendUnreachableError", "BuildStopped", "DEFAULT_CHUNK", "DEFAULT_RECALL_TARGET", "DEFAULT_RERANK_CANDIDATES",
    "EXACT_MAX_ITEMS", "Embedder", "FIELDS", "GalleryIndex", "INDEX_BACKENDS", "INDEX_KINDS", "IndexFileError",
    "IndexPlan", "Location", "MILVUS_TOKEN_ENV", "MILVUS_URI_ENV", "Manifest", "ModelMismatchError", "QueryInputError",
    "Records", "SearchFilter", "SearchResult", "UnknownFieldError", "add_to_index", "approximate_recall",
    "build_index", "check_same_model", "collect_gallery", "create_index", "draw_results", "embed_resumable",
    "evaluate_with_index", "feature_file_contract", "model_contract", "open_index", "parse_where", "plan_index",
    "query_filter", "read_feature_file", "read_list_file", "recall_at_k", "records_from_items", "search_index",
    "stop_on_sigterm",
]
