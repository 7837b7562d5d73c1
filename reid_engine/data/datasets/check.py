"""Check a dataset on disk without training: per-split statistics and every file that breaks the layout.

The engine of ``reid-data check``: the dataset is built by :func:`get_dataset` exactly as
training builds it, but inside :func:`.audit.collect_file_problems`, so the parsers list
every unusable file instead of stopping at the first. The files the listings leave out
(hidden, system, not images) are counted, and every image read is opened and decoded.
"""

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional

from PIL import Image

from .audit import FileProblem, collect_file_problems, collect_skipped_files
from .bases import DatasetFormatError, ImageDataset
from .catalog import get_dataset
from .paths import DatasetNotFoundError
from .splits import SplitFileError

__all__ = ["DatasetCheck", "check_dataset", "STATISTICS_HEADERS", "statistics_headers", "statistics_rows",
           "dataset_image_paths", "find_undecodable_images"]

# progress(done, total, seconds so far) while images are decoded
Progress = Callable[[int, int, float], None]

STATISTICS_HEADERS = ["subset", "# ids", "# images", "# cameras", "# junk (dropped)", "# distractors"]


def statistics_headers(dataset: ImageDataset) -> List[str]:
    """STATISTICS_HEADERS, counting tracklets instead of images for a video dataset."""
    if getattr(dataset, "IS_VIDEO", False):
        return [header.replace("images", "tracklets") for header in STATISTICS_HEADERS]
    return list(STATISTICS_HEADERS)
NOT_APPLICABLE = "-"


@dataclass
class DatasetCheck:
    """What :func:`check_dataset` found.

    Attributes:
        name: the dataset name as given.
        root: the data root.
        dataset: the parsed dataset, or None when it could not be built.
        problems: every file (or list line) that does not fit the layout, and every image
            that does not decode.
        error: the one-line reason the dataset could not be built (e.g. a missing folder).
        skipped: the files and folders the listings left out (hidden, system, not images),
            once each, with the reason.
        decoded: how many images were opened and decoded (0 with ``decode=False``).
    """

    name: str
    root: str
    dataset: Optional[ImageDataset] = None
    problems: List[FileProblem] = field(default_factory=list)
    error: Optional[str] = None
    skipped: List[FileProblem] = field(default_factory=list)
    decoded: int = 0

    @property
    def ok(self) -> bool:
        """True when the dataset was built and no file broke its layout."""
        return self.dataset is not None and not self.problems and self.error is None


def check_dataset(name: str, root: str, split_id: int = 0, key: str = "NAME", decode: bool = True,
                  progress: Optional[Progress] = None) -> DatasetCheck:
    """Parse dataset ``name`` under ``root``, collecting every layout problem.

    Args:
        name: a registered dataset name (as in DATASETS.NAMES).
        root: the data root.
        split_id: DATASETS.SPLIT_ID, for the sets with random splits.
        key: what holds ``name``, for the unknown-name error.
        decode: open and decode every image of the parsed dataset, reporting those that fail.
        progress: called now and then while decoding (see :func:`find_undecodable_images`).
    Returns:
        The :class:`DatasetCheck`. Missing folders, unusable split files and data that
        cannot form a dataset are reported in ``error`` rather than raised.
    Raises:
        UnknownChoiceError / ConfigError: a wrong name or SPLIT_ID (a usage error).
    """
    result = DatasetCheck(name, root)
    with collect_file_problems() as problems, collect_skipped_files() as skipped:
        try:
            result.dataset = get_dataset(name, root, key=key, split_id=split_id)
        except (DatasetFormatError, DatasetNotFoundError, SplitFileError) as e:
            result.error = " ".join(str(e).split())
    result.problems = list(problems)
    result.skipped = list({item.path: item for item in skipped}.values())
    if decode and result.dataset is not None:
        paths = dataset_image_paths(result.dataset)
        result.problems += find_undecodable_images(paths, progress)
        result.decoded = len(paths)
    return result


def dataset_image_paths(dataset: ImageDataset) -> List[str]:
    """Every image path of the dataset's splits once (the frames of each tracklet of a video set), in order."""
    paths = {}
    for items in (dataset.train, dataset.query, dataset.gallery):
        for path, _, _ in items:
            for one in (path if isinstance(path, tuple) else (path,)):
                paths[one] = None
    return list(paths)


def _decode(path: str) -> None:
    with Image.open(path) as image:
        if image.format == "JPEG":
            # Decode at 1/8 scale: every coded byte is still read (a truncated file still
            # fails), and the inverse DCT and colour conversion get cheaper (about 1.2x on
            # 256x128 crops, more on large images).
            image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()


def find_undecodable_images(paths: Iterable[str], progress: Optional[Progress] = None,
                            every_seconds: float = 5.0) -> List[FileProblem]:
    """Open and decode each image with PIL; return a problem for each one that fails.

    Args:
        paths: image files.
        progress: called with ``(done, total, seconds so far)`` about every ``every_seconds``
            and once at the end (when given).
        every_seconds: the interval of the progress calls.
    Returns:
        ``FileProblem(path, "an image that decodes (<error>)")`` for each failure, in order.
    """
    paths = list(paths)
    problems, start = [], time.monotonic()
    last = start
    for done, path in enumerate(paths, 1):
        try:
            _decode(path)
        except Exception as e:  # PIL raises many types (OSError, SyntaxError, ValueError, ...)
            reason = " ".join(str(e).replace(f" '{path}'", "").replace(path, "the file").split()) or "no detail"
            problems.append(FileProblem(path, f"an image that decodes ({type(e).__name__}: {reason})"))
        now = time.monotonic()
        if progress is not None and (now - last >= every_seconds or done == len(paths)):
            progress(done, len(paths), now - start)
            last = now
    return problems


def statistics_rows(dataset: ImageDataset) -> List[list]:
    """One row per split: ``[subset, ids, images, cameras, junk dropped, distractors]``.

    Junk is shown where the parser counted it (``dataset.junk_counts``) and distractors
    (query / gallery images of a distractor id) where the dataset has distractor ids;
    otherwise ``"-"``. Training-only sets have a train row only, test-only sets no train row.
    """
    splits = [] if dataset.TEST_ONLY else [("train", dataset.train)]
    if not dataset.TRAIN_ONLY:
        splits += [("query", dataset.query), ("gallery", dataset.gallery)]
    rows = []
    for split, items in splits:
        junk = dataset.junk_counts.get(split, NOT_APPLICABLE)
        # Train pids are relabelled, so a distractor value means nothing there.
        distractors = (sum(1 for _, pid, _ in items if pid in dataset.distractor_pids)
                       if dataset.distractor_pids and split != "train" else NOT_APPLICABLE)
        rows.append([split, len({pid for _, pid, _ in items}), len(items), len({cam for _, _, cam in items}),
                     junk, distractors])
    return rows
