"""A contact sheet of SyntheticReID samples, to look at the benchmark before training on it."""

import os
from typing import Dict, List, Sequence

from PIL import Image, ImageDraw

from .generator import DEFAULT_SPEC, PlannedImage, SyntheticSpec, SyntheticWorld
from .render import OUT_H, OUT_W

__all__ = ["color_sharing_groups", "write_contact_sheet"]


def color_sharing_groups(world: SyntheticWorld, pids: Sequence[int]) -> Dict[int, List[int]]:
    """Group ``pids`` (1-based) by shared outfit colors; only groups of 2+ are returned."""
    groups: Dict[int, List[int]] = {}
    for pid in pids:
        groups.setdefault(world.identities[pid - 1].outfit, []).append(pid)
    return {k: v for k, v in groups.items() if len(v) > 1}


def write_contact_sheet(path: str, spec: SyntheticSpec = DEFAULT_SPEC, num_ids: int = 12,
                        zoom: int = 2) -> str:
    """Write a PNG grid of samples: rows = test identities, columns = cameras.

    Identities wearing the same colors are placed on neighboring rows, to show that
    color alone does not separate them.

    Args:
        path: the output PNG.
        spec: the generator settings.
        num_ids: the number of rows.
        zoom: integer upscaling for viewing.
    Returns:
        ``path``.
    """
    world = SyntheticWorld(spec)
    test_pids = list(range(spec.num_train_ids + 1, spec.num_train_ids + spec.num_test_ids + 1))
    rows: List[int] = []
    for group in color_sharing_groups(world, test_pids).values():
        rows.extend(group[:3])
    rows = (rows + [p for p in test_pids if p not in rows])[:num_ids]
    gap, label_w = 2, 34
    sheet = Image.new("RGB", (label_w + spec.num_cameras * (OUT_W + gap),
                              len(rows) * (OUT_H + gap) + 14), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for c in range(spec.num_cameras):
        draw.text((label_w + c * (OUT_W + gap) + 20, 1), f"c{c + 1}", fill=(0, 0, 0))
    for r, pid in enumerate(rows):
        y = 14 + r * (OUT_H + gap)
        draw.text((2, y + OUT_H // 2 - 5), f"{pid:04d}", fill=(0, 0, 0))
        for c in range(spec.num_cameras):
            item = PlannedImage("gallery", pid, pid - 1, c, 0)
            sheet.paste(world.render(item), (label_w + c * (OUT_W + gap), y))
    if zoom > 1:
        sheet = sheet.resize((sheet.width * zoom, sheet.height * zoom), Image.NEAREST)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    sheet.save(path)
    return path
