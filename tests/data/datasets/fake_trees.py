"""Tiny fake dataset trees (empty files) built from the layouts in datasets/README.md.

Parsing reads names and list files only, never pixels, so most images are empty files;
the trees ``reid-data check`` decodes hold real 2x2 images (:func:`write_image`).
"""

import functools
import io
import os
from typing import Dict, Iterable, List, Sequence, Tuple

from PIL import Image

_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP"}


@functools.lru_cache(maxsize=None)
def image_bytes(extension: str) -> bytes:
    """The bytes of a 2x2 RGB image in the format of ``extension`` (e.g. ``".jpg"``)."""
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), (200, 30, 30)).save(buffer, _FORMATS[extension.lower()])
    return buffer.getvalue()


def write_image(path: str) -> str:
    """Write a real 2x2 image at ``path`` (format from the extension, folders created); return the path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(image_bytes(os.path.splitext(path)[1]))
    return path


def touch(path: str) -> str:
    """Create an empty file (and its folders); return the path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
    return path


def touch_all(base: str, rels: Iterable[str]) -> None:
    """Create empty files ``base/<rel>`` for every relative path."""
    for rel in rels:
        touch(os.path.join(base, rel))


def write(path: str, text: str) -> str:
    """Write ``text`` to ``path`` (creating folders); return the path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def relative(items, base: str) -> List[Tuple[str, int, int]]:
    """``(path relative to base with '/', pid, camid)`` of items, sorted."""
    return sorted((os.path.relpath(p, base).replace(os.sep, "/"), pid, cam) for p, pid, cam in items)


def numbered(expected: Sequence[Tuple[str, str, str]]) -> List[Tuple[str, int, int]]:
    """Expected ``(rel, id text, camera text)`` numbered as the spec says: sorted text order."""
    pids = {v: i for i, v in enumerate(sorted({p for _, p, _ in expected}))}
    cams = {v: i for i, v in enumerate(sorted({c for _, _, c in expected}))}
    return sorted((rel, pids[p], cams[c]) for rel, p, c in expected)


# ------------------------------------------------------------------ Market-style (for the CLI)

MARKET_FILES: Dict[str, List[str]] = {
    "bounding_box_train": ["0002_c1s1_000451_03.jpg", "0002_c2s1_000551_01.jpg", "0007_c3s3_077419_01.jpg",
                           "-1_c1s1_000001_00.jpg"],
    "query": ["0003_c1s1_000001_00.jpg", "0004_c2s1_000101_00.jpg"],
    "bounding_box_test": ["-1_c1s1_000401_03.jpg", "-1_c2s1_000402_03.jpg", "0000_c4s1_000301_05.jpg",
                          "0000_c5s1_000302_05.jpg", "0003_c2s1_000201_01.jpg", "0004_c6s1_000201_01.jpg"],
}


def make_market(root: str) -> str:
    """Market-1501 (real 2x2 images) with junk (-1) in train and gallery and two distractors (0) in the gallery."""
    base = os.path.join(root, "Market-1501-v15.09.15")
    for folder, names in MARKET_FILES.items():
        for name in names:
            write_image(os.path.join(base, folder, name))
    return base


# ---------------------------------------------------------------------------------- VIPeR

def make_viper_images(base: str, num_people: int) -> None:
    """``cam_a/NNN_0.bmp`` and ``cam_b/NNN_90.bmp`` (real 2x2 images) for people 0..num_people-1."""
    for i in range(num_people):
        write_image(os.path.join(base, "cam_a", f"{i:03d}_0.bmp"))
        write_image(os.path.join(base, "cam_b", f"{i:03d}_90.bmp"))
