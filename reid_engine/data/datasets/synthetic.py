"""SyntheticReID and SyntheticVideoReID: the built-in benchmarks, generated under the data root on first use."""

import logging

from ..synthetic import (
    DEFAULT_SPEC,
    GENERATOR_VERSION,
    SHIFTED_SPEC,
    SHIFTED_TINY_SPEC,
    TINY_SPEC,
    SyntheticSpec,
    ensure_synthetic_reid,
    read_marker,
)
from ..synthetic.video import TINY_VIDEO_SPEC, VIDEO_SPEC, VideoSpec, generate_synthetic_video
from .market_style import MarketStyleDataset
from .registry import DATASET_REGISTRY
from .video import dukemtmcvidreid

logger = logging.getLogger(__name__)


@DATASET_REGISTRY.register()
class SyntheticReID(MarketStyleDataset):
    """The procedural pedestrian benchmark in ``<root>/SyntheticReID/`` (Market-1501 layout).

    The folder is generated (atomically) the first time the dataset is constructed, from
    :data:`SPEC`; an existing complete folder is read as it is, whatever settings wrote it
    (``tools/make_synthetic.py`` can write other sizes).

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    FOLDER = "SyntheticReID"
    SPEC: SyntheticSpec = DEFAULT_SPEC
    NAME_EXAMPLE = "0001_c1s1_000001_00.jpg"

    def __init__(self, root: str = "datasets", combineall: bool = False):
        self.DATASET_DIRS = (self.FOLDER,)
        folder = ensure_synthetic_reid(root, self.FOLDER, self.SPEC)
        marker = read_marker(folder) or {}
        if marker.get("generator_version") != GENERATOR_VERSION:
            logger.warning("%s was written by generator version %s (current: %s); delete it "
                           "to regenerate", folder, marker.get("generator_version"),
                           GENERATOR_VERSION)
        super().__init__(root, combineall=combineall)


@DATASET_REGISTRY.register()
class SyntheticReIDTiny(SyntheticReID):
    """A ~300-image SyntheticReID (24 train ids, 16 test ids, 3 cameras) for tests and CI."""

    FOLDER = "SyntheticReIDTiny"
    SPEC = TINY_SPEC


@DATASET_REGISTRY.register()
class SyntheticReIDShifted(SyntheticReID):
    """SyntheticReID's domain-shifted sibling in ``<root>/SyntheticReIDShifted/``: another camera network.

    The target of cross-domain and label-free training (issue 26), generated from
    :data:`~reid_engine.data.synthetic.SHIFTED_SPEC` by the same generator as SyntheticReID,
    with everything that makes a domain changed and the sizes kept (300 train ids, 300
    test ids, 100 distractors):

    - other identities: its own seed (26) draws other people (none of SyntheticReID's);
    - another clothing palette (pinks, mints, lavenders, rust, ... no color of SyntheticReID's);
    - other cameras: 8 instead of 6, other viewpoints (people mostly face the camera:
      front probability 0.6-0.95 instead of 0.25-0.75) and distances (people 0.8-0.95
      of the size instead of 0.9-1.05);
    - other lighting and casts: darker (brightness 0.55-0.9 instead of 0.7-1.15) and a warm
      cast over the whole network (red +0.12, blue -0.15) on top of each camera's own;
    - other backgrounds: darker, greener scenes.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    FOLDER = "SyntheticReIDShifted"
    SPEC = SHIFTED_SPEC


@DATASET_REGISTRY.register()
class SyntheticReIDShiftedTiny(SyntheticReID):
    """A ~300-image SyntheticReIDShifted (24 train ids, 16 test ids, 4 cameras) for tests."""

    FOLDER = "SyntheticReIDShiftedTiny"
    SPEC = SHIFTED_TINY_SPEC


@DATASET_REGISTRY.register()
class SyntheticVideoReID(dukemtmcvidreid):
    """The procedural tracklet benchmark in ``<root>/SyntheticVideoReID/`` (DukeMTMC-VideoReID layout).

    Generated the first time it is constructed from :data:`SPEC` (see
    :mod:`reid_engine.data.synthetic.video`): SyntheticReID's people followed over a few
    frames with a gentle drift of position and scale.

    Args:
        root: the data root.
        combineall: fold query + gallery into training.
    """

    FOLDER = "SyntheticVideoReID"
    SPEC: VideoSpec = VIDEO_SPEC

    def __init__(self, root: str = "datasets", combineall: bool = False):
        self.DATASET_DIRS = (self.FOLDER,)
        ensure_synthetic_reid(root, self.FOLDER, self.SPEC, generate=generate_synthetic_video)
        super().__init__(root, combineall=combineall)


@DATASET_REGISTRY.register()
class SyntheticVideoReIDTiny(SyntheticVideoReID):
    """A ~40-tracklet SyntheticVideoReID (8 train ids, 6 test ids, 3 cameras, 3-5 frames) for tests."""

    FOLDER = "SyntheticVideoReIDTiny"
    SPEC = TINY_VIDEO_SPEC
