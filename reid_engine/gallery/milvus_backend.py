"""The distributed back end: one Milvus collection per index, through pymilvus' `MilvusClient`.

The collection holds an ``id`` primary key (the row), the ``vector`` and one scalar field per
metadata field; the manifest (model contract, fields, plan) is a collection property, so
every client of the server sees the same model. The URI decides where Milvus runs and the
code does not change: a local ``.db`` file runs Milvus Lite in-process (pip install
milvus-lite), ``http://host:19530`` (with a token ``user:password`` where the server has
authentication) a standalone server or a cluster.
"""
import json
import logging
from typing import Optional

import numpy as np

from ..utils.errors import first_line, require_module
from .errors import BackendUnreachableError, IndexFileError
from .filters import SearchFilter
from .index import GalleryIndex, Manifest
from .planner import CALIBRATION_QUERIES, calibrate, plan_index
from .records import FIELDS, INT_FIELDS, Records

__all__ = ["MANIFEST_PROPERTY", "MilvusGallery", "connect"]

logger = logging.getLogger(__name__)

MANIFEST_PROPERTY = "reid_engine.manifest"
_INSERT_BATCH = 2000
_MAX_PATH = 4096
_MAX_LIMIT = 16384  # Milvus' largest top-k


def _pymilvus():
    return require_module("pymilvus", "the Milvus gallery back end")


def connect(uri: str, token: str = "", timeout: float = 10.0):
    """A `MilvusClient` for `uri` (a Milvus Lite .db file, or http(s)://host:port).

    Raises:
        BackendUnreachableError: nothing answers at `uri` (one line naming it).
    """
    pymilvus = _pymilvus()
    try:
        return pymilvus.MilvusClient(uri=uri, token=token, timeout=timeout)
    except Exception as e:  # pymilvus raises MilvusException (or grpc errors) for a dead server
        raise BackendUnreachableError(f"no Milvus server answers at --milvus-uri {uri} ({first_line(e)}): start "
                                      "it, or check the URI (a local .db path runs Milvus Lite)") from None


class MilvusGallery(GalleryIndex):
    """A gallery index in a Milvus collection (FLAT, IVF_FLAT or HNSW with the IP metric; IVF lists in float32)."""

    backend = "milvus"

    def __init__(self, client, uri: str, collection: str, manifest: Manifest):
        super().__init__(manifest)
        self.client, self.uri, self.collection = client, uri, collection

    @property
    def location(self) -> str:
        return f"{self.uri} (collection {self.collection})"

    # ------------------------------------------------------------------ creating and opening
    @classmethod
    def create(cls, client, uri: str, collection: str, manifest: Manifest) -> "MilvusGallery":
        """A new empty collection (an existing one of that name is dropped first)."""
        pymilvus = _pymilvus()
        if client.has_collection(collection):
            client.drop_collection(collection)
        schema = pymilvus.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", pymilvus.DataType.INT64, is_primary=True)
        schema.add_field("vector", pymilvus.DataType.FLOAT_VECTOR, dim=manifest.dim)
        schema.add_field("path", pymilvus.DataType.VARCHAR, max_length=_MAX_PATH)
        for name in FIELDS[1:]:
            schema.add_field(name, pymilvus.DataType.INT64 if name in INT_FIELDS else pymilvus.DataType.DOUBLE)
        plan = manifest.plan
        index_params = client.prepare_index_params()
        if plan.kind == "ivf":
            index_params.add_index("vector", index_type="IVF_FLAT", metric_type="IP", params={"nlist": plan.nlist})
        elif plan.kind == "hnsw":
            index_params.add_index("vector", index_type="HNSW", metric_type="IP",
                                   params={"M": plan.hnsw_m, "efConstruction": plan.ef_construction})
        else:
            index_params.add_index("vector", index_type="FLAT", metric_type="IP")
        client.create_collection(collection, schema=schema, index_params=index_params,
                                 properties={MANIFEST_PROPERTY: json.dumps(manifest.to_dict())})
        return cls(client, uri, collection, manifest)

    @classmethod
    def open(cls, client, uri: str, collection: str) -> "MilvusGallery":
        """An existing collection written by reid-index.

        Raises:
            IndexFileError: no such collection, or one without a reid-index manifest.
        """
        if not client.has_collection(collection):
            raise IndexFileError(f"Milvus at {uri} has no collection {collection!r}: build it with reid-index build "
                                 f"--backend milvus --index {collection}")
        properties = client.describe_collection(collection).get("properties") or {}
        try:
            manifest = Manifest.from_dict(json.loads(properties[MANIFEST_PROPERTY]))
        except (KeyError, ValueError, TypeError):
            raise IndexFileError(f"collection {collection!r} at {uri} was not written by reid-index (no readable "
                                 f"{MANIFEST_PROPERTY} property): rebuild it with reid-index build") from None
        client.load_collection(collection)  # a renamed (freshly built) collection starts released; idempotent
        return cls(client, uri, collection, manifest)

    # ------------------------------------------------------------------ adding
    def _add(self, features: np.ndarray, records: Records) -> None:
        plan = self.manifest.plan
        wanted = plan_index(len(self) + len(features), plan.requested, plan.recall_target)
        if len(self) and wanted.kind != plan.kind:
            logger.warning("the gallery has grown past its %s index (a %s one suits %d items): rebuild it with "
                           "reid-index build to switch", plan.kind, wanted.kind, len(self) + len(features))
        start = len(self)
        for begin in range(0, len(features), _INSERT_BATCH):
            stop = min(begin + _INSERT_BATCH, len(features))
            rows = []
            for r in range(begin, stop):
                row = {"id": start + r, "vector": features[r].tolist()}
                row.update(records.row_dict(r))
                rows.append(row)
            self.client.upsert(self.collection, rows)  # keyed by row: an interrupted add run again adds no duplicates
        self.client.flush(self.collection)

    def _tune(self) -> None:
        plan = self.manifest.plan
        total = len(self)
        if plan.kind not in ("ivf", "hnsw") or total == 0:
            return
        rows = np.sort(np.random.default_rng(1).choice(total, min(total, CALIBRATION_QUERIES), replace=False))
        vectors = self.vectors(rows)
        exact_param = plan.nlist if plan.kind == "ivf" else min(_MAX_LIMIT, max(total, 16))
        calibrate(plan, lambda q, k, p: self._raw_search(q, k, "", p)[1],
                  lambda q, k: self._raw_search(q, k, "", exact_param)[1], vectors, rows,
                  plan.nlist if plan.kind == "ivf" else 4096)

    # ------------------------------------------------------------------ searching
    def _raw_search(self, queries: np.ndarray, k: int, expression: str, param: Optional[int]):
        params = {}
        if self.manifest.plan.kind == "ivf":
            params = {"nprobe": int(param or self.manifest.plan.search_param or 1)}
        elif self.manifest.plan.kind == "hnsw":
            params = {"ef": int(max(param or self.manifest.plan.search_param or k, k))}
        hits = self.client.search(self.collection, data=queries.tolist(), limit=min(k, _MAX_LIMIT),
                                  filter=expression, search_params={"metric_type": "IP", "params": params})
        sims = np.full((len(queries), k), -np.inf, dtype=np.float32)
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        for row, found in enumerate(hits):
            for col, hit in enumerate(found):
                sims[row, col], ids[row, col] = hit["distance"], hit["id"]
        return sims, ids

    def _search(self, queries: np.ndarray, k: int, flt: SearchFilter, exact: bool):
        plan = self.manifest.plan
        param = (plan.nlist if plan.kind == "ivf" else min(_MAX_LIMIT, len(self))) if exact else None
        return self._raw_search(queries, k, flt.milvus_expression(), param)

    def records(self, ids: np.ndarray) -> Records:
        rows = self._get(ids, list(FIELDS))
        return Records.from_columns({name: [r[name] for r in rows] for name in FIELDS})

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        rows = self._get(ids, ["vector"])
        return np.asarray([r["vector"] for r in rows], dtype=np.float32).reshape(len(rows), self.manifest.dim)

    def _get(self, ids, fields):
        ids = [int(i) for i in np.asarray(ids).ravel()]
        if not ids:
            return []
        by_id = {r["id"]: r for r in self.client.get(self.collection, ids=ids, output_fields=fields)}
        return [by_id[i] for i in ids]

    def save(self) -> None:
        """Store the manifest (count, fields, plan) in the collection's properties."""
        self.client.alter_collection_properties(self.collection,
                                                properties={MANIFEST_PROPERTY: json.dumps(self.manifest.to_dict())})
