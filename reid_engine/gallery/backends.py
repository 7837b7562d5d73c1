"""Creating and opening a gallery index by back end: "faiss" (a file, the default) or "milvus" (a collection).

The one place that maps a back end name and a location to a `GalleryIndex`, so the
command line, the Python API and the tests open indexes the same way.
"""
import os
from dataclasses import dataclass
from typing import Dict, Optional

from ..utils.errors import UsageError
from .faiss_backend import FaissGallery
from .index import GalleryIndex, Manifest
from .planner import DEFAULT_RECALL_TARGET, plan_index

__all__ = ["INDEX_BACKENDS", "MILVUS_URI_ENV", "MILVUS_TOKEN_ENV", "Location", "create_index", "open_index",
           "replace_collection"]

INDEX_BACKENDS = ("faiss", "milvus")
#: where the Milvus back end connects when --milvus-uri is not given (a cluster: http://host:19530)
MILVUS_URI_ENV = "REID_MILVUS_URI"
MILVUS_TOKEN_ENV = "REID_MILVUS_TOKEN"
_DEFAULT_LITE_FILE = "milvus_gallery.db"


@dataclass(frozen=True)
class Location:
    """Where an index lives: a faiss file path, or a Milvus collection name at `milvus_uri`."""

    name: str
    backend: str = "faiss"
    milvus_uri: str = ""
    milvus_token: str = ""

    def __post_init__(self):
        if self.backend not in INDEX_BACKENDS:
            raise UsageError(f"unknown index back end {self.backend!r} (--backend): use one of "
                             f"{', '.join(INDEX_BACKENDS)}")
        if not self.name:
            raise UsageError("no index given (--index): pass a file path (faiss) or a collection name (milvus)")

    @property
    def uri(self) -> str:
        """The Milvus URI: --milvus-uri, else $REID_MILVUS_URI, else a Milvus Lite file in the working folder."""
        return self.milvus_uri or os.environ.get(MILVUS_URI_ENV, "") or _DEFAULT_LITE_FILE

    @property
    def token(self) -> str:
        """The Milvus token ("user:password" or an API key), else $REID_MILVUS_TOKEN."""
        return self.milvus_token or os.environ.get(MILVUS_TOKEN_ENV, "")

    @property
    def staging_dir(self) -> str:
        """The folder a build keeps its embedded chunks in until the index is written (resumable builds)."""
        if self.backend == "faiss":
            return self.name + ".partial"
        base = os.path.dirname(os.path.abspath(self.uri)) if "://" not in self.uri else os.getcwd()
        return os.path.join(base, f"{self.name}.partial")


_CLIENTS: Dict[tuple, object] = {}


def _client(location: Location):
    from .milvus_backend import connect

    key = (location.uri, location.token)
    if key not in _CLIENTS:  # one client per URI: Milvus Lite allows one per file and process
        _CLIENTS[key] = connect(location.uri, location.token)
    return _CLIENTS[key]


def create_index(location: Location, contract: Dict[str, str], num_items: int, kind: str = "auto",
                 recall_target: float = DEFAULT_RECALL_TARGET, collection: Optional[str] = None) -> GalleryIndex:
    """A new, empty index for `num_items` items of a model with `contract` (nothing is written until `save`).

    Args:
        location: where (the faiss file, or the Milvus collection).
        contract: the model's embedding contract (`DeployContract.to_dict()`).
        num_items: the expected gallery size (picks the index kind, see `planner.plan_index`).
        kind, recall_target: as `planner.plan_index`.
        collection: Milvus only: create this collection instead of `location.name` (a build's staging one).
    """
    manifest = Manifest(contract=dict(contract), plan=plan_index(num_items, kind, recall_target), fields=["path"])
    if location.backend == "faiss":
        return FaissGallery(location.name, manifest)
    from .milvus_backend import MilvusGallery

    return MilvusGallery.create(_client(location), location.uri, collection or location.name, manifest)


def open_index(location: Location) -> GalleryIndex:
    """An existing index (faiss file or Milvus collection); one-line errors when missing or damaged."""
    if location.backend == "faiss":
        return FaissGallery.open(location.name)
    from .milvus_backend import MilvusGallery

    return MilvusGallery.open(_client(location), location.uri, location.name)


def replace_collection(location: Location, staging: str) -> None:
    """Milvus: make the staging collection the index (drop the old one, rename) once it is complete."""
    client = _client(location)
    if client.has_collection(location.name):
        client.drop_collection(location.name)
    client.rename_collection(staging, location.name)

