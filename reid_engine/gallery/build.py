"""Building and extending an index, resumably: embed in chunks kept on disk, then write the index once.

A build embeds its items in chunks of `chunk_size`; each chunk's features are written
atomically to the staging folder (`Location.staging_dir`) beside a plan that names the
items and the model. The index itself is written only when every chunk is there (faiss:
one atomic file replace; Milvus: a staging collection renamed over the old one), so a
build stopped by SIGTERM, or killed, leaves the previous index as it was, and the same
command run again embeds only the missing chunks. A changed item list or model starts
the staging over.
"""
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from typing import Callable, Iterator, Sequence

import numpy as np

from ..utils.file_io import atomic_write, atomic_write_text
from .backends import Location, create_index, open_index, replace_collection
from .errors import BuildStopped
from .index import GalleryIndex
from .model_card import check_same_model
from .planner import DEFAULT_RECALL_TARGET
from .records import Records

__all__ = ["DEFAULT_CHUNK", "stop_on_sigterm", "embed_resumable", "build_index", "add_to_index"]

logger = logging.getLogger(__name__)

DEFAULT_CHUNK = 1024
_PLAN_FILE = "plan.json"


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into `BuildStopped` while the block runs (main thread only; the old handler is restored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _stop(signum, frame):
        raise BuildStopped("stopped by SIGTERM: the chunks embedded so far are kept and the previous index is "
                           "unchanged; run the same command again to continue")

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _plan_key(paths: Sequence[str], contract: dict, chunk_size: int, mode: str) -> dict:
    digest = hashlib.sha256("\n".join(map(str, paths)).encode("utf-8")).hexdigest()
    model = hashlib.sha256(json.dumps(contract, sort_keys=True).encode("utf-8")).hexdigest()
    return {"mode": mode, "items": len(paths), "items_sha256": digest, "model_sha256": model,
            "chunk_size": int(chunk_size)}


def embed_resumable(embed: Callable[[Sequence], np.ndarray], items: Sequence, paths: Sequence[str], contract: dict,
                    staging_dir: str, chunk_size: int = DEFAULT_CHUNK, mode: str = "build") -> np.ndarray:
    """All items' features, embedding only the chunks the staging folder does not hold yet.

    Args:
        embed: ``embed(items) -> (n, D) features``.
        items: what `embed` takes; paths: their paths (they name the job with the model's contract).
        contract: the model's contract; staging_dir: where chunks are kept.
        chunk_size: items per chunk (a stopped build loses at most one chunk of work).
        mode: "build" or "add" (a different job).
    """
    key = _plan_key(paths, contract, chunk_size, mode)
    plan_file = os.path.join(staging_dir, _PLAN_FILE)
    if os.path.isfile(plan_file):
        with open(plan_file, encoding="utf-8") as f:
            stale = json.load(f) != key
        if stale:
            logger.info("The staging folder %s belongs to another job (items or model changed): starting over",
                        staging_dir)
            shutil.rmtree(staging_dir)
    os.makedirs(staging_dir, exist_ok=True)
    atomic_write_text(plan_file, json.dumps(key, indent=1) + "\n")
    num_chunks = max(1, -(-len(items) // chunk_size))
    names = [os.path.join(staging_dir, f"chunk_{i:06d}.npy") for i in range(num_chunks)]
    done = sum(os.path.isfile(n) for n in names)
    if done:
        logger.info("Resuming: %d of %d chunks already embedded in %s", done, num_chunks, staging_dir)
    start, embedded_now = time.perf_counter(), 0
    for i, name in enumerate(names):
        if os.path.isfile(name):
            continue
        features = np.ascontiguousarray(embed(items[i * chunk_size:(i + 1) * chunk_size]), dtype=np.float32)
        atomic_write(name, lambda f, x=features: np.save(f, x))
        done, embedded_now = done + 1, embedded_now + 1
        eta = (time.perf_counter() - start) / embedded_now * (num_chunks - done)
        logger.info("Chunk %d of %d embedded (%d items), ETA %.0f s", done, num_chunks, len(features), eta)
    return np.concatenate([np.load(n, allow_pickle=False) for n in names])


def build_index(location: Location, embed: Callable[[Sequence], np.ndarray], items: Sequence, records: Records,
                contract: dict, kind: str = "auto", recall_target: float = DEFAULT_RECALL_TARGET,
                chunk_size: int = DEFAULT_CHUNK) -> GalleryIndex:
    """Embed `items` (resumably) and write a new index at `location`, replacing any previous one at the end.

    Args:
        location: the index to (re)write.
        embed: ``embed(items) -> features`` (e.g. `Embedder.embed_items`).
        items, records: what to embed and its metadata (one record per item).
        contract: the model's embedding contract (`DeployContract.to_dict()`).
        kind, recall_target: the index choice (`planner.plan_index`).
        chunk_size: items per resumable chunk.
    Returns:
        the written index.
    """
    staging = location.staging_dir
    features = embed_resumable(embed, items, list(records.path), contract, staging, chunk_size, "build")
    staging_collection = f"{location.name}__building"
    index = create_index(location, contract, len(items), kind, recall_target, collection=staging_collection)
    index.add(features, records)
    index.save()
    if location.backend == "milvus":
        replace_collection(location, staging_collection)
        index = open_index(location)
    shutil.rmtree(staging, ignore_errors=True)
    logger.info("Wrote the %s index %s: %d items, %s", index.manifest.plan.kind, index.location, len(index),
                _plan_text(index))
    return index


def add_to_index(location: Location, embed: Callable[[Sequence], np.ndarray], items: Sequence, records: Records,
                 contract: dict, chunk_size: int = DEFAULT_CHUNK) -> GalleryIndex:
    """Embed new items (resumably) and append them to an existing index of the same model."""
    index = open_index(location)
    check_same_model(index.contract, contract, what="new items'")
    staging = location.staging_dir + ".add"
    features = embed_resumable(embed, items, list(records.path), contract, staging, chunk_size, "add")
    index.add(features, records)
    index.save()
    shutil.rmtree(staging, ignore_errors=True)
    logger.info("Added %d items to %s: %d in all, %s", len(items), index.location, len(index), _plan_text(index))
    return index


def _plan_text(index: GalleryIndex) -> str:
    plan = index.manifest.plan
    if plan.kind == "ivf":
        return f"IVF-Flat with {plan.nlist} lists, nprobe {plan.search_param} (recall@10 {plan.calibrated_recall})"
    if plan.kind == "hnsw":
        return f"HNSW M {plan.hnsw_m}, efSearch {plan.search_param} (recall@10 {plan.calibrated_recall})"
    return "exact search"

