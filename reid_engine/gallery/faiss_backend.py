"""The embedded back end: a faiss index and the records in one file, written atomically.

The file is an uncompressed ``.npz`` holding the serialized faiss index (``index``), one
array per metadata field and the manifest as JSON (``manifest``). It is replaced in one
rename (`utils.file_io.atomic_write`), so a reader sees the old or the new index, never
a mix, and a writer killed mid-way leaves the old one.
"""
import json
import logging
import os
import zipfile
from typing import Optional

import numpy as np

from ..utils.errors import require_module
from ..utils.file_io import atomic_write, remove_stale_temp_files
from .errors import IndexFileError
from .filters import SearchFilter
from .index import GalleryIndex, Manifest
from .planner import CALIBRATION_QUERIES, calibrate, plan_index
from .records import FIELDS, Records

__all__ = ["FaissGallery"]

logger = logging.getLogger(__name__)


def _faiss():
    return require_module("faiss", "the embedded gallery index", package="faiss-cpu")


class FaissGallery(GalleryIndex):
    """A gallery index in a faiss index (flat, IVF-Flat or HNSW, inner product on unit vectors)."""

    backend = "faiss"

    def __init__(self, path: str, manifest: Manifest, index=None, records: Optional[Records] = None):
        super().__init__(manifest)
        self.path = path
        self._index = index if index is not None else self._new_index(manifest)
        self._records = records if records is not None else Records.from_columns({"path": []})
        self._exact = None  # a flat copy for exact search on an approximate index, built on demand

    @property
    def location(self) -> str:
        return self.path

    # ------------------------------------------------------------------ building
    @staticmethod
    def _new_index(manifest: Manifest):
        faiss, plan, dim = _faiss(), manifest.plan, manifest.dim
        if plan.kind == "ivf" and plan.storage == "fp16":
            # half-precision lists: half the memory and half the bytes a (memory-bound) scan reads, at the
            # same recall@10 against exact search to 4 decimals (bench_gallery)
            return faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, plan.nlist,
                                                 faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        if plan.kind == "ivf":
            return faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, plan.nlist, faiss.METRIC_INNER_PRODUCT)
        if plan.kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, plan.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = plan.ef_construction
            return index
        return faiss.IndexFlatIP(dim)

    def _add(self, features: np.ndarray, records: Records) -> None:
        total = len(self) + len(features)
        plan = self.manifest.plan
        wanted = plan_index(total, plan.requested, plan.recall_target)
        if self._index.ntotal == 0 or wanted.kind != plan.kind:
            # a first fill, or a gallery grown past what its kind suits: re-plan over every item
            old = self.vectors(np.arange(len(self)))
            self.manifest.plan = wanted
            self._rebuild(np.concatenate([old, features]), total)
        else:
            self._index.add(features)
        self._records = self._records.concat(records)
        self._exact = None

    def _rebuild(self, features: np.ndarray, total: int) -> None:
        """A fresh index of the planned kind over all `features` (IVF trained on a sample of them)."""
        plan = self.manifest.plan
        self._index = self._new_index(self.manifest)
        if plan.kind == "ivf":
            rng = np.random.default_rng(0)
            sample = features[np.sort(rng.choice(total, min(total, plan.nlist * 64), replace=False))]
            logger.info("Training the IVF index (%d lists) on %d of %d features", plan.nlist, len(sample), total)
            self._index.train(sample)
        self._index.add(features)
        if plan.kind == "ivf":
            self._index.make_direct_map()  # lets `vectors` read items back

    def _tune(self) -> None:
        plan = self.manifest.plan
        if plan.kind not in ("ivf", "hnsw"):
            return
        rng = np.random.default_rng(1)
        rows = np.sort(rng.choice(self._index.ntotal, min(self._index.ntotal, CALIBRATION_QUERIES), replace=False))
        vectors = self.vectors(rows)
        max_param = plan.nlist if plan.kind == "ivf" else 4096
        calibrate(plan, lambda q, k, p: self._raw_search(q, k, None, p)[1],
                  lambda q, k: self._exact_index().search(q, k)[1], vectors, rows, max_param)
        logger.info("%s index: %s %d reaches recall@10 %.4f against exact search (target %.3f)", plan.kind,
                    "nprobe" if plan.kind == "ivf" else "efSearch", plan.search_param, plan.calibrated_recall,
                    plan.recall_target)

    # ------------------------------------------------------------------ searching
    def _exact_index(self):
        if self.manifest.plan.kind == "flat":
            return self._index
        if self._exact is None:
            self._exact = _faiss().IndexFlatIP(self.manifest.dim)
            self._exact.add(self.vectors(np.arange(len(self))))
        return self._exact

    def _raw_search(self, queries: np.ndarray, k: int, selector, param: int):
        faiss, kind = _faiss(), self.manifest.plan.kind
        if kind == "ivf":
            # faiss' default parallel mode (queries over threads): splitting one query's lists over the threads
            # measured 1.5x faster on idle cores but 10-30x slower when another process holds a core
            params = faiss.SearchParametersIVF(nprobe=int(param), sel=selector)
        elif kind == "hnsw":
            params = faiss.SearchParametersHNSW(efSearch=int(max(param, k)), sel=selector)
        else:
            params = faiss.SearchParameters(sel=selector) if selector is not None else None
        return self._index.search(queries, k, params=params)

    def _search(self, queries: np.ndarray, k: int, flt: SearchFilter, exact: bool):
        selector, bitmap = None, None
        if flt:
            bitmap = np.packbits(flt.mask(self._records), bitorder="little")
            selector = _faiss().IDSelectorBitmap(len(self._records), _faiss().swig_ptr(bitmap))
        if exact or self.manifest.plan.kind == "flat":
            index = self._exact_index()
            params = _faiss().SearchParameters(sel=selector) if selector is not None else None
            sims, ids = index.search(queries, k, params=params)
        else:
            sims, ids = self._raw_search(queries, k, selector, self.manifest.plan.search_param)
        del bitmap  # the selector reads it until the search returns
        return sims, ids

    def records(self, ids: np.ndarray) -> Records:
        return self._records.take(np.asarray(ids, dtype=np.int64))

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return np.zeros((0, self.manifest.dim), dtype=np.float32)
        return self._index.reconstruct_batch(ids)

    # ------------------------------------------------------------------ files
    def save(self) -> None:
        """Write the file atomically (the previous file stays until the rename)."""
        faiss = _faiss()
        blob = faiss.serialize_index(self._index)
        manifest = json.dumps(self.manifest.to_dict())
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        remove_stale_temp_files(self.path)
        atomic_write(self.path, lambda f: np.savez(f, manifest=np.asarray(manifest), index=blob,
                                                   **self._records.columns()))

    @classmethod
    def open(cls, path: str) -> "FaissGallery":
        """Read an index file.

        Raises:
            IndexFileError: missing, unreadable or not a reid-index file (one line; the file is not touched).
        """
        if not os.path.isfile(path):
            raise IndexFileError(f"index file {path} does not exist: build it with reid-index build --index {path}")
        faiss = _faiss()
        try:
            with np.load(path, allow_pickle=False) as data:
                manifest = Manifest.from_dict(json.loads(str(data["manifest"])))
                records = Records(**{name: data[name] for name in FIELDS})
                index = faiss.deserialize_index(data["index"])
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, RuntimeError) as e:
            raise IndexFileError(f"{path} is not a readable reid-index file ({type(e).__name__}): rebuild it with "
                                 "reid-index build, or restore it from a copy") from None
        if index.ntotal != len(records) or manifest.count != len(records):
            raise IndexFileError(f"{path} is inconsistent ({index.ntotal} vectors, {len(records)} records): rebuild "
                                 "it with reid-index build")
        return cls(path, manifest, index, records)

