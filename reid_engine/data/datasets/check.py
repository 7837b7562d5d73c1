"""Check a dataset on disk without training: per-split statistics and every file that breaks the layout.

The engine of ``reid-data check``: the dataset is built by :func:`get_dataset` exactly as
training builds it, but inside :func:`.audit.collect_file_problems`, so the parsers list
every unusable file instead of stopping at the first.
"""

from dataclasses import dataclass, field
from typing import List, Optional

from .audit import FileProblem, collect_file_problems
from .bases import DatasetFormatError, ImageDataset
from .catalog import get_dataset
from .paths import DatasetNotFoundError
from .splits import SplitFileError

__all__ = ["DatasetCheck", "check_dataset", "STATISTICS_HEADERS", "statistics_headers", "statistics_rows"]

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
        problems: every file (or list line) that does not fit the layout.
        error: the one-line reason the dataset could not be built (e.g. a missing folder).
    """

    name: str
    root: str
    dataset: Optional[ImageDataset] = None
    problems: List[FileProblem] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when the dataset was built and no file broke its layout."""
        return self.dataset is not None and not self.problems and self.error is None


def check_dataset(name: str, root: str, split_id: int = 0, key: str = "NAME") -> DatasetCheck:
    """Parse dataset ``name`` under ``root``, collecting every layout problem.

    Args:
        name: a registered dataset name (as in DATASETS.NAMES).
        root: the data root.
        split_id: DATASETS.SPLIT_ID, for the sets with random splits.
        key: what holds ``name``, for the unknown-name error.
    Returns:
        The :class:`DatasetCheck`. Missing folders, unusable split files and data that
        cannot form a dataset are reported in ``error`` rather than raised.
    Raises:
        UnknownChoiceError / ConfigError: a wrong name or SPLIT_ID (a usage error).
    """
    result = DatasetCheck(name, root)
    with collect_file_problems() as problems:
        try:
            result.dataset = get_dataset(name, root, key=key, split_id=split_id)
        except (DatasetFormatError, DatasetNotFoundError, SplitFileError) as e:
            result.error = " ".join(str(e).split())
    result.problems = list(problems)
    return result


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
