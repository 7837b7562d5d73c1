"""SyntheticReID: the procedural pedestrian benchmark.

- :mod:`.appearance` draws identities and cameras (palettes, `Identity`, `Camera`);
- :mod:`.render` draws one 128x64 sighting of an identity seen by a camera;
- :mod:`.generator` holds the settings (:class:`SyntheticSpec`), the split plan
  (:class:`SyntheticWorld`) and the atomic first-use creation of the folder;
- :mod:`.contact_sheet` writes a PNG grid of samples to look at;
- :mod:`.sequence` renders a short multi-person video with ground-truth boxes and ids (tracking).

The registered dataset classes (``SyntheticReID``, ``SyntheticReIDTiny``, the domain-shifted
``SyntheticReIDShifted``, ``SyntheticReIDShiftedTiny``) live in
``data.datasets.synthetic`` and read what this package writes.
"""

from .contact_sheet import color_sharing_groups, write_contact_sheet
from .generator import (
    DEFAULT_SPEC,
    GENERATOR_VERSION,
    MARKER,
    SHIFTED_SPEC,
    SHIFTED_TINY_SPEC,
    SPLIT_DIRS,
    TINY_SPEC,
    PlannedImage,
    SyntheticSpec,
    SyntheticWorld,
    ensure_synthetic_reid,
    generate_synthetic_reid,
    read_marker,
)
from .render import render_image
from .sequence import SequenceSpec, SyntheticSequence, render_sequence

__all__ = [
    "DEFAULT_SPEC", "TINY_SPEC", "SHIFTED_SPEC", "SHIFTED_TINY_SPEC",
    "GENERATOR_VERSION", "MARKER", "SPLIT_DIRS", "SyntheticSpec",
    "SyntheticWorld", "PlannedImage", "generate_synthetic_reid", "ensure_synthetic_reid",
    "read_marker", "render_image", "color_sharing_groups", "write_contact_sheet",
    "SequenceSpec", "SyntheticSequence", "render_sequence",
]
