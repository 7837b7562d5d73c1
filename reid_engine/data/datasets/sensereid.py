"""SenseReID (Zhao et al., CVPR 2017) as torchreid tests on it: a test-only set."""

import re

from .audit import report_file_problem
from .bases import ImageDataset
from .layout import list_files, match_names
from .paths import require_one_dir
from .registry import DATASET_REGISTRY

__all__ = ["sensereid"]


@DATASET_REGISTRY.register()
class sensereid(ImageDataset):  # noqa: N801 (torchreid's registered name)
    """SenseReID: 522 query ids / 1,040 images; 1,717 gallery ids / 3,388 images; no training split.

    ``sensereid/SenseReID/test_probe/`` and ``test_gallery/`` (fast-reid's ``SenseReID/`` and
    ``test_prob/`` accepted too) with ``<pid>_<camera>.jpg``
    images (both ints; the camera is used as written). As in torchreid, both splits are
    renumbered by the gallery's ids (sorted here, so the labels never change), so every
    probe id must have gallery images. torchreid's dummy training split (a copy of the
    test images) is left out: the set is refused in DATASETS.NAMES. fast-reid's
    ``SenseReID`` trains on the same images instead.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    TEST_ONLY = True
    LAYOUT = "test_probe/ and test_gallery/ with images named <pid>_<camera>.jpg"
    NAME = re.compile(r"(\d+)_(\d+)\.jpg$")
    RULE = "a name <pid>_<camera>.jpg with integer fields (e.g. 0001_0.jpg)"

    def __init__(self, root: str = "datasets", combineall: bool = False):
        name = self._locate(root)
        probe, gallery = ([(path, int(m.group(1)), int(m.group(2))) for path, m in match_names(
            list_files(require_one_dir(self.dataset_dir, spellings, name, self.LAYOUT), ".jpg", name),
            self.NAME, name, self.RULE)] for spellings in (("test_probe", "test_prob"), ("test_gallery",)))
        labels = {pid: label for label, pid in enumerate(sorted({pid for _, pid, _ in gallery}))}
        query = []
        for path, pid, camid in probe:
            if pid in labels:
                query.append((path, labels[pid], camid))
            else:
                report_file_problem(name, path, "a probe image whose id also has test_gallery/ images",
                                    fix="add its gallery images or remove it")
        gallery = [(path, labels[pid], camid) for path, pid, camid in gallery]
        super().__init__([], query, gallery, name, combineall=combineall, distractor_pids=(),
                         source=self.dataset_dir)
