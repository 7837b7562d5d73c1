"""The shape VehicleID and VERI-Wild share: an image folder, ``train_test_split/`` list files and test sets of several sizes.

Each has a plain class (its default test size) and ``Small`` / ``Medium`` / ``Large``
variants that only fix the size; :func:`sized_variants` makes and registers those.
"""

import os
from typing import List, Sequence, Tuple

from .bases import ImageDataset, Item
from .paths import require_dir, require_file
from .registry import DATASET_REGISTRY

__all__ = ["SizedTestListDataset", "sized_variants"]

SPLIT_FOLDER = "train_test_split"


class SizedTestListDataset(ImageDataset):
    """Base of the sets read from ``<IMAGE_FOLDER>/`` and the list files of ``train_test_split/``.

    Subclasses set :attr:`IMAGE_FOLDER`, :attr:`LAYOUT` (for errors), :attr:`TEST_SIZES`,
    :attr:`TEST_SIZE` (the default) and implement :meth:`read_splits`. The dataset folder
    is found by the accepted names of :mod:`.folders`.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
        test_size: one of :attr:`TEST_SIZES` (0: the class's :attr:`TEST_SIZE`).
    Raises:
        ValueError: a test size the set does not have.
    """

    IMAGE_FOLDER = ""
    LAYOUT = ""
    TEST_SIZES: Sequence[int] = ()
    TEST_SIZE = 0

    def __init__(self, root: str = "datasets", combineall: bool = False, test_size: int = 0):
        test_size = test_size or self.TEST_SIZE
        name = type(self).__name__
        if test_size not in self.TEST_SIZES:
            raise ValueError(f"{name}: test_size must be one of {tuple(self.TEST_SIZES)}, got {test_size}")
        self._locate(root)
        self.image_dir = require_dir(os.path.join(self.dataset_dir, self.IMAGE_FOLDER), name, self.LAYOUT)
        self.split_dir = require_dir(os.path.join(self.dataset_dir, SPLIT_FOLDER), name, self.LAYOUT)
        train, query, gallery = self.read_splits(test_size)
        super().__init__(train, query, gallery, name, combineall=combineall, distractor_pids=(),
                         source=self.dataset_dir)

    def list_file(self, file_name: str) -> str:
        """``train_test_split/<file_name>`` if it exists, else a one-line error naming the layout."""
        return require_file(os.path.join(self.split_dir, file_name), type(self).__name__, self.LAYOUT)

    def read_splits(self, test_size: int) -> Tuple[List[Item], List[Item], List[Item]]:
        """Return the ``(train, query, gallery)`` items for the test set of ``test_size``."""
        raise NotImplementedError


def sized_variants(base: type, sizes: Sequence[int], unit: str) -> Tuple[type, ...]:
    """Make and register ``Small<base>``, ``Medium<base>``, ``Large<base>`` with the given test sizes.

    Args:
        base: the plain dataset class.
        sizes: the small, medium and large test sizes.
        unit: what the size counts, for the docstring (e.g. ``"vehicle"``).
    Returns:
        The three classes, in that order.
    """
    classes = []
    for prefix, size in zip(("Small", "Medium", "Large"), sizes):
        name = prefix + base.__name__
        cls = type(name, (base,), {"TEST_SIZE": size, "__module__": base.__module__, "__qualname__": name,
                                   "__doc__": f"{base.__name__} with the {size:,}-{unit} test set."})
        DATASET_REGISTRY.register(cls)
        classes.append(cls)
    return tuple(classes)
