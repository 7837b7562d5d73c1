"""The metadata of gallery items: path, identity, camera, time (or frame) and track id, column-wise.

`Records` holds one array per field (`FIELDS`); an unknown value is -1. Which fields an index
actually *has* is the set of columns with at least one known value (`present_fields`), so a
filter on the time of a gallery built without times is refused instead of matching nothing.
Items come from a dataset split, an image folder, or a list file (CSV with a header: `path`
required, any of `pid`, `camid`, `time`, `frame`, `trackid`).
"""
import csv
import os
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..data.tracklets import is_tracklet_item
from ..utils.errors import UsageError
from .errors import QueryInputError

__all__ = ["FIELDS", "INT_FIELDS", "UNKNOWN", "Records", "records_from_items", "read_list_file"]

#: metadata fields of every item; "time" is seconds or a frame number, whatever the source uses
FIELDS = ("path", "pid", "camid", "time", "trackid")
INT_FIELDS = ("pid", "camid", "trackid")
UNKNOWN = -1
#: list-file column aliases
_ALIASES = {"frame": "time", "camera": "camid", "cam": "camid", "track": "trackid", "id": "pid"}


@dataclass
class Records:
    """Column-wise metadata of N items: `path` (N,) str, `pid` / `camid` / `trackid` int64, `time` float64."""

    path: np.ndarray
    pid: np.ndarray
    camid: np.ndarray
    time: np.ndarray
    trackid: np.ndarray

    def __len__(self) -> int:
        return len(self.path)

    @classmethod
    def from_columns(cls, columns: Dict[str, Sequence]) -> "Records":
        """Records from a dict of columns (missing numeric columns are UNKNOWN)."""
        n = len(columns["path"])
        out = {"path": np.asarray([str(p) for p in columns["path"]], dtype=str)}
        for name in FIELDS[1:]:
            values = columns.get(name)
            dtype = np.float64 if name == "time" else np.int64
            out[name] = np.full(n, UNKNOWN, dtype=dtype) if values is None else np.asarray(values, dtype=dtype)
        return cls(**out)

    def columns(self) -> Dict[str, np.ndarray]:
        """Every field as an array, in FIELDS order."""
        return {name: getattr(self, name) for name in FIELDS}

    def present_fields(self) -> List[str]:
        """The fields with at least one known value (path always)."""
        return ["path"] + [n for n in FIELDS[1:] if np.any(getattr(self, n) != UNKNOWN)]

    def take(self, rows) -> "Records":
        """The records of `rows` (an index array)."""
        return Records(**{n: a[rows] for n, a in self.columns().items()})

    def concat(self, other: "Records") -> "Records":
        """These records followed by `other`'s."""
        return Records(**{n: np.concatenate([a, getattr(other, n)]) for n, a in self.columns().items()})

    def item(self, row: int) -> Tuple[str, int, int]:
        """Row `row` as an evaluation item ``(path, pid, camid)`` (what the rank pictures draw)."""
        return str(self.path[row]), int(self.pid[row]), int(self.camid[row])

    def row_dict(self, row: int) -> dict:
        """Row `row` as a JSON-ready dict of its fields."""
        out = {"path": str(self.path[row])}
        for name in FIELDS[1:]:
            value = getattr(self, name)[row]
            out[name] = int(value) if name in INT_FIELDS else float(value)
        return out


def records_from_items(items: Sequence) -> Records:
    """Records of `(path, pid, camid)` items or `(frame paths, pid, camid)` tracklets (track id = its row)."""
    tracklets = bool(items) and is_tracklet_item(items[0])
    paths = [str(it[0][0] if is_tracklet_item(it) else it[0]) for it in items]
    columns = {"path": paths, "pid": [int(it[1]) for it in items], "camid": [int(it[2]) for it in items]}
    if tracklets:
        columns["trackid"] = list(range(len(items)))
    return Records.from_columns(columns)


def read_list_file(path: str) -> Records:
    """Read a list file: CSV with a header row, `path` required, optional pid, camid, time (or frame), trackid.

    Relative image paths are taken relative to the list file's folder.
    Raises:
        QueryInputError: the file is missing, has no `path` column, or a value is not a number.
    """
    if not os.path.isfile(path):
        raise QueryInputError(f"list file {path} does not exist: pass a CSV file with a header row naming "
                              "'path' and any of pid, camid, time, trackid")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or "path" not in rows[0]:
        raise QueryInputError(f"list file {path} has no 'path' column (or no rows): its first row must name the "
                              "columns, e.g. path,camid,time")
    folder = os.path.dirname(os.path.abspath(path))
    columns: Dict[str, list] = {"path": [os.path.join(folder, r["path"]) for r in rows]}
    for key in rows[0]:
        name = _ALIASES.get(key.strip().lower(), key.strip().lower())
        if name not in FIELDS[1:]:
            if name != "path":
                raise UsageError(f"list file {path}: unknown column {key!r}; use path, "
                                 f"{', '.join(FIELDS[1:])} (or frame for time)")
            continue
        try:
            columns[name] = [float(r[key]) if r[key] not in ("", None) else UNKNOWN for r in rows]
        except ValueError as e:
            raise QueryInputError(f"list file {path}: column {key!r} holds a value that is not a number ({e}); "
                                  "fix the file") from None
    return Records.from_columns(columns)
