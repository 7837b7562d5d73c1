"""`GalleryIndex`: what every back end offers (faiss embedded, Milvus), and what they share.

An index holds L2-normalized features with their `Records` and a manifest: the embedding
contract of its model (`model_card`), the metadata fields it has, and the index plan
(`planner.IndexPlan`). Distances are cosine distances (1 - cos), as the evaluation's
``cosine`` metric. Ids are rows in insertion order, 0 .. N-1.
"""
import abc
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..inference.contract import DeployContract
from .filters import SearchFilter
from .model_card import check_feature_dim, check_same_model
from .planner import IndexPlan
from .records import FIELDS, Records

__all__ = ["FORMAT_VERSION", "Manifest", "SearchResult", "GalleryIndex", "normalized"]

FORMAT_VERSION = 1


def normalized(features: np.ndarray) -> np.ndarray:
    """Float32, C-contiguous rows of unit L2 norm (zero rows stay zero)."""
    x = np.ascontiguousarray(features, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


@dataclass
class Manifest:
    """What an index knows about itself: its model's contract, its fields, its plan."""

    contract: Dict[str, str]
    plan: IndexPlan
    fields: List[str]
    count: int = 0
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {"format_version": self.format_version, "count": self.count, "fields": list(self.fields),
                "plan": self.plan.to_dict(), "contract": dict(self.contract)}

    @classmethod
    def from_dict(cls, data: dict) -> "Manifest":
        """Parse what `to_dict` wrote (KeyError / TypeError on a damaged manifest)."""
        return cls(contract=dict(data["contract"]), plan=IndexPlan(**data["plan"]), fields=list(data["fields"]),
                   count=int(data["count"]), format_version=int(data["format_version"]))

    @property
    def dim(self) -> int:
        """The feature dimension."""
        return int(self.contract["feature_dim"])


@dataclass
class SearchResult:
    """Per query, the hits best first: ids (-1 = none), cosine distances, and each hit's metadata."""

    ids: List[np.ndarray]
    distances: List[np.ndarray]
    records: List[Records]

    def to_json(self, queries: Sequence[str]) -> List[dict]:
        """One dict per query: its name and its ranked hits with distances and metadata."""
        out = []
        for name, ids, dist, recs in zip(queries, self.ids, self.distances, self.records):
            hits = [dict(rank=r + 1, id=int(i), distance=float(d), **recs.row_dict(r))
                    for r, (i, d) in enumerate(zip(ids, dist))]
            out.append({"query": name, "hits": hits})
        return out


class GalleryIndex(abc.ABC):
    """The API both back ends implement; create with `backends.create_index`, open with `backends.open_index`."""

    backend = ""

    def __init__(self, manifest: Manifest):
        self.manifest = manifest

    @property
    def contract(self) -> Dict[str, str]:
        """The embedding contract of the index's model (string entries, as `DeployContract.to_dict`)."""
        return self.manifest.contract

    def __len__(self) -> int:
        return self.manifest.count

    def check_query(self, contract: Optional[DeployContract], dim: int, source: str) -> None:
        """Refuse a query of another model (when its contract is known) or of another dimension."""
        if contract is not None:
            check_same_model(self.contract, contract.to_dict())
        check_feature_dim(self.contract, dim, source)

    def add(self, features: np.ndarray, records: Records) -> None:
        """Append items (features of the index's model, one row per record); persist with `save`."""
        check_feature_dim(self.contract, features.shape[1], "the added features")
        if len(features) != len(records):
            raise ValueError(f"{len(features)} feature rows for {len(records)} records")
        self._add(normalized(features), records)
        self.manifest.count += len(records)
        self.manifest.fields = [f for f in FIELDS if f in set(self.manifest.fields) | set(records.present_fields())]
        self._tune()

    def _tune(self) -> None:
        """Set the approximate index's search parameter for the recall target (`planner.calibrate`); exact: nothing."""

    def search(self, queries: np.ndarray, k: int, filters: Optional[Sequence[SearchFilter]] = None,
               exact: bool = False) -> SearchResult:
        """The top-`k` items of each query row (cosine distance, best first), each under its filter.

        Args:
            queries: (Q, D) features of the index's model.
            k: hits per query (fewer when fewer items pass the filter).
            filters: one `SearchFilter` per query, or None.
            exact: exact search even where the index is approximate (for recall against exact).
        """
        queries = normalized(queries)
        check_feature_dim(self.contract, queries.shape[1], "the query features")
        filters = list(filters) if filters is not None else [SearchFilter()] * len(queries)
        for f in filters:
            f.check_fields(self.manifest.fields)
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        dist = np.full((len(queries), k), np.inf, dtype=np.float32)
        groups: Dict[SearchFilter, List[int]] = {}
        for row, f in enumerate(filters):
            groups.setdefault(f, []).append(row)
        for f, rows in groups.items():
            sims, found = self._search(queries[rows], min(k, max(1, len(self))), f, exact)
            ids[rows, :found.shape[1]] = found
            dist[rows, :found.shape[1]] = 1.0 - sims
        kept = [row[row >= 0] for row in ids]
        return SearchResult(ids=kept, distances=[d[:len(i)] for d, i in zip(dist, kept)],
                            records=[self.records(i) for i in kept])

    def info(self) -> dict:
        """What `reid-index info` prints: back end, size, fields, plan, model."""
        return {"backend": self.backend, "location": self.location, **self.manifest.to_dict()}

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the index lives (a file, or a Milvus URI and collection)."""

    @abc.abstractmethod
    def _add(self, features: np.ndarray, records: Records) -> None:
        """Append normalized features and their records."""

    @abc.abstractmethod
    def _search(self, queries: np.ndarray, k: int, flt: SearchFilter, exact: bool):
        """(similarities (Q, k') float32, ids (Q, k') int64, -1 padded) under one filter."""

    @abc.abstractmethod
    def records(self, ids: np.ndarray) -> Records:
        """The records of `ids`."""

    @abc.abstractmethod
    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored (normalized) features of `ids`, (len(ids), D) float32."""

    @abc.abstractmethod
    def save(self) -> None:
        """Persist the index (atomically: a failure leaves the previous version in place)."""
