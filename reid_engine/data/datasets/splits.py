"""Random train / test splits: drawn once, kept in a JSON file beside the data, picked by DATASETS.SPLIT_ID.

Small benchmarks (VIPeR, CUHK01, QMUL iLIDS, PRID single-shot) are evaluated over several
random divisions of their people into train and test. The first load draws them with a
fixed seed and writes them to ``<dataset folder>/splits_reid_engine.json``; every later
load reads that file, so a reported result can be reproduced by keeping it (and a lost
file is drawn again identically). The file stores ids or file names, never absolute
paths, so the data root can move. torchreid's own ``splits*.json`` files have another
format and name and are left alone.
"""

import json
import logging
import os
import random
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

from reid_engine.config import ConfigError

from ...utils.errors import ReidUserError

__all__ = ["SPLIT_FILE_NAME", "SPLIT_SEED", "SplitFileError", "load_or_draw_splits", "check_split_id",
           "split_mismatch", "draw_id_splits", "check_split_ids", "shuffled_halves", "two_way_split", "pick_id_split"]

logger = logging.getLogger(__name__)

SPLIT_FILE_NAME = "splits_reid_engine.json"
SPLIT_SEED = 0  # fixed: a deleted split file is drawn again the same
_FORMAT = "reid_engine dataset splits v1"

Split = Dict[str, list]


class SplitFileError(ReidUserError, ValueError):
    """A split file that cannot be read or does not fit the data; nothing is deleted."""


def _unreadable(path: str, dataset: str, reason: str) -> SplitFileError:
    return SplitFileError(f"{dataset}: cannot use the split file '{path}' ({reason}); restore it, or delete it "
                          f"to draw the splits again (results made with the old file then no longer compare)")


def split_mismatch(path: str, dataset: str, detail: str) -> SplitFileError:
    """The error for a split file whose ids or names are not in the data (one line naming the file)."""
    return _unreadable(path, dataset, f"it does not match the images: {detail}")


def read_split_file(path: str, dataset: str, keys: Sequence[str]) -> List[Split]:
    """Read the splits of ``path``; every split must hold a list under each of ``keys``.

    Raises:
        SplitFileError: the file cannot be read, is not JSON, or has another structure.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise _unreadable(path, dataset, f"{type(e).__name__}: {' '.join(str(e).split())}") from None
    splits = data.get("splits") if isinstance(data, dict) else None
    if (not isinstance(splits, list) or not splits
            or not all(isinstance(s, dict) and all(isinstance(s.get(k), list) for k in keys) for s in splits)):
        raise _unreadable(path, dataset, f"expected {{\"splits\": [{{{', '.join(repr(k) for k in keys)}: "
                                         f"[...]}}, ...]}} as written by reid_engine")
    return splits


def _write_split_file(path: str, dataset: str, splits: List[Split]) -> None:
    """Write ``splits`` atomically (parallel loaders all write the same content)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"format": _FORMAT, "dataset": dataset, "seed": SPLIT_SEED, "splits": splits}, f)
        os.replace(tmp, path)
    except OSError as e:
        # A read-only data folder: the draw is seeded, so every run still gets the same splits.
        logger.warning("%s: could not write the split file %s (%s); using the seeded splits without saving them",
                       dataset, path, e)
        if os.path.exists(tmp):
            os.remove(tmp)
        return
    logger.info("%s: drew %d random splits and wrote them to %s", dataset, len(splits), path)


def load_or_draw_splits(path: str, dataset: str, draw: Callable[[random.Random], List[Split]],
                        keys: Sequence[str]) -> List[Split]:
    """Read the splits of ``path``, or draw them with ``draw`` and write them there first.

    Args:
        path: the split file.
        dataset: the dataset name (for messages).
        draw: makes the list of splits from a seeded ``random.Random``.
        keys: the lists every split holds (checked when the file is read).
    Returns:
        The splits.
    Raises:
        SplitFileError: an existing file that cannot be read (it is never deleted).
    """
    if os.path.exists(path):
        return read_split_file(path, dataset, keys)
    splits = draw(random.Random(SPLIT_SEED))
    _write_split_file(path, dataset, splits)
    return splits


def check_split_id(split_id: int, count: int, path: str, dataset: str) -> int:
    """Return ``split_id`` if it is in ``0..count-1``.

    Raises:
        ConfigError: out of range (one line naming DATASETS.SPLIT_ID, the range and the file).
    """
    if isinstance(split_id, bool) or not isinstance(split_id, int) or not 0 <= split_id < count:
        raise ConfigError(f"DATASETS.SPLIT_ID {split_id!r} is out of range for {dataset}: it has {count} splits "
                          f"(from '{path}'); use 0..{count - 1}")
    return split_id


def shuffled_halves(ids: Sequence, rng: random.Random, num_splits: int = 10) -> Iterator[Tuple[list, list]]:
    """``num_splits`` times: the sorted ids shuffled by ``rng``, cut into the first half (rounded down) and the rest.

    The draw every random split protocol here shares (torchreid's): ``(train ids, test ids)``
    in drawn order.
    """
    for _ in range(num_splits):
        order = sorted(ids)
        rng.shuffle(order)
        half = len(order) // 2
        yield order[:half], order[half:]


def draw_id_splits(ids: Sequence[int], rng: random.Random, num_splits: int = 10) -> List[Split]:
    """``num_splits`` draws of half the ids (rounded down) for training and the rest for testing.

    Args:
        ids: the ids to divide.
        rng: the seeded generator.
        num_splits: how many draws (torchreid draws 10).
    Returns:
        ``[{"train": sorted ids, "test": sorted ids}, ...]``.
    """
    return [{"train": sorted(train), "test": sorted(test)} for train, test in shuffled_halves(ids, rng, num_splits)]


def check_split_ids(split: Split, known: Sequence, path: str, dataset: str) -> None:
    """Raise :func:`split_mismatch` if a ``train`` / ``test`` entry of ``split`` is not in ``known``."""
    known = set(known)
    for key in ("train", "test"):
        unknown = [value for value in split[key] if value not in known]
        if unknown:
            raise split_mismatch(path, dataset, f"its {key} list names {unknown[0]!r}, which is not in the data")


def two_way_split(split_id: int, draws: List[Split], path: str, dataset: str):
    """torchreid's numbering of two-camera splits: entry 2k is draw k with camera A as the
    query, entry 2k + 1 the same draw with camera B as the query.

    Returns:
        ``(draw, b_is_query)``.
    Raises:
        ConfigError: ``split_id`` outside ``0 .. 2 * len(draws) - 1``.
    """
    index = check_split_id(split_id, 2 * len(draws), path, dataset)
    return draws[index // 2], bool(index % 2)


def pick_id_split(path: str, dataset: str, ids: Sequence, split_id: int, two_way: bool = False) -> Tuple[Split, bool]:
    """The train / test ids of split ``split_id``: 10 seeded half / half draws over ``ids``, kept in ``path``.

    Args:
        path: the split file (read if it exists, else drawn and written).
        dataset: the dataset name (for messages).
        ids: the ids to divide.
        split_id: DATASETS.SPLIT_ID.
        two_way: number the splits as :func:`two_way_split` (each draw twice, the query camera swapped).
    Returns:
        ``({"train": ids, "test": ids}, b_is_query)``; ``b_is_query`` is False unless ``two_way``.
    Raises:
        SplitFileError: the file cannot be read or names ids not in ``ids``.
        ConfigError: ``split_id`` out of range.
    """
    draws = load_or_draw_splits(path, dataset, lambda rng: draw_id_splits(ids, rng), ("train", "test"))
    if two_way:
        draw, b_is_query = two_way_split(split_id, draws, path, dataset)
    else:
        draw, b_is_query = draws[check_split_id(split_id, len(draws), path, dataset)], False
    check_split_ids(draw, ids, path, dataset)
    return draw, b_is_query
