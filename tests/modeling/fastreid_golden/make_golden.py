"""Write fast-reid's own outputs for the layouts in ../fastreid_keys/ as golden files.

Run it under an environment where fast-reid 1.4 imports (a scratch venv; fast-reid is never
a dependency of this project), from the repository root:

    cd /path/to/unpacked/fastreid-1.4 && python /path/to/repo/tests/modeling/fastreid_golden/make_golden.py \
        backbones/osnet_x1_0

(one layout per process: fast-reid keeps RegNet options in a global config; it resolves its
EfficientNet yaml paths from the current directory.)

For each layout it fills the keys with fastreid_state.random_fastreid_state(GOLDEN_SEED), loads
them strictly into the model fast-reid builds, runs the fixed golden images through it in
eval mode and writes <layout>.json here (the layout's "/" becomes "__"). A backbone golden
holds the output shape, the spatially averaged output (one value per channel) and the
channel-averaged map; a whole-model golden holds the test embeddings. The tests build our
model, load the same random state and compare to these numbers.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.getcwd())

from fastreid_state import (  # noqa: E402
    GOLDEN_IMAGE_SIZE,
    GOLDEN_SEED,
    backbone_input,
    backbone_options,
    golden_images,
    golden_layout,
    golden_path,
    random_fastreid_state,
)

# Whole-model layouts: fast-reid config values of the Market1501 file, read off fast-reid's
# configs (Base-bagtricks.yml, Base-SBS.yml, Base-MGN.yml and the family file).
_BOT = {"MODEL.META_ARCHITECTURE": "Baseline", "MODEL.BACKBONE.DEPTH": "50x", "MODEL.HEADS.WITH_BNNECK": True,
        "MODEL.BACKBONE.LAST_STRIDE": 1, "MODEL.HEADS.NECK_FEAT": "before",
        "MODEL.HEADS.POOL_LAYER": "GlobalAvgPool", "MODEL.HEADS.CLS_LAYER": "Linear"}
MODEL_CONFIGS = {
    "bagtricks_S50": dict(_BOT, **{"MODEL.BACKBONE.NAME": "build_resnest_backbone"}),
    "mgn_R50-ibn": dict(_BOT, **{"MODEL.META_ARCHITECTURE": "MGN", "MODEL.BACKBONE.WITH_IBN": True,
                                 "MODEL.HEADS.NECK_FEAT": "after", "MODEL.HEADS.EMBEDDING_DIM": 256,
                                 "MODEL.HEADS.POOL_LAYER": "GeneralizedMeanPoolingP",
                                 "MODEL.HEADS.CLS_LAYER": "CircleSoftmax", "MODEL.HEADS.SCALE": 64,
                                 "MODEL.HEADS.MARGIN": 0.35}),
    "bagtricks_vit": dict(_BOT, **{"MODEL.BACKBONE.NAME": "build_vit_backbone", "MODEL.BACKBONE.DEPTH": "base",
                                   "MODEL.BACKBONE.FEAT_DIM": 768, "MODEL.BACKBONE.STRIDE_SIZE": (16, 16),
                                   "MODEL.BACKBONE.SIE_COE": 3.0, "MODEL.HEADS.POOL_LAYER": "Identity",
                                   "MODEL.PIXEL_MEAN": [127.5] * 3, "MODEL.PIXEL_STD": [127.5] * 3,
                                   "INPUT.SIZE_TRAIN": [256, 128], "INPUT.SIZE_TEST": [256, 128]}),
}
# Layouts whose fast-reid model only runs at its training size (its ViT asserts the input
# size), with their golden image size instead of GOLDEN_IMAGE_SIZE.
IMAGE_SIZES = {"bagtricks_vit": (256, 128)}


def _fastreid_cfg(options):
    from fastreid.config import get_cfg

    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.BACKBONE.PRETRAIN = False
    cfg.MODEL.HEADS.NUM_CLASSES = 751
    for key, value in options.items():
        node = cfg
        *path, leaf = key.split(".")
        for part in path:
            node = getattr(node, part)
        setattr(node, leaf, value)
    return cfg


def _rounded(value):
    """Floats to 7 significant digits (float32 precision), recursively."""
    if isinstance(value, float):
        return float(f"{value:.7g}")
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def make(name):
    """Compute and write the golden of one layout."""
    state = random_fastreid_state(golden_layout(name), GOLDEN_SEED)
    image_size = IMAGE_SIZES.get(name, GOLDEN_IMAGE_SIZE)
    images = golden_images(*image_size)
    if name.startswith("backbones/"):
        from fastreid.modeling.backbones import build_backbone

        backbone, depth, extra, last_stride = backbone_options(name)
        options = {"MODEL.BACKBONE.NAME": backbone, "MODEL.BACKBONE.DEPTH": depth,
                   "MODEL.BACKBONE.LAST_STRIDE": last_stride}
        options.update({f"MODEL.BACKBONE.{k}": v for k, v in extra.items()})
        model = build_backbone(_fastreid_cfg(options))
        model.load_state_dict(state, strict=True)
        with torch.no_grad():
            out = model.eval()(backbone_input(images))
        golden = {"kind": "backbone", "shape": list(out.shape),
                  "pooled": out.mean((2, 3)).tolist(), "map": out.mean(1).tolist()}
    else:
        from fastreid.modeling import build_model

        model = build_model(_fastreid_cfg(MODEL_CONFIGS[name]))
        model.load_state_dict(state, strict=True)
        with torch.no_grad():
            out = model.eval()({"images": images.float()})
        golden = {"kind": "model", "shape": list(out.shape), "embeddings": out.tolist()}
    golden.update({"layout": name, "seed": GOLDEN_SEED, "image_size": list(image_size),
                   "source": "fastreid 1.4.0"})
    path = golden_path(name)
    with open(path, "w") as handle:
        json.dump(_rounded(golden), handle)
    print(f"{name}: output {tuple(out.shape)}, |out| max {out.abs().max():.4g} -> {path}")


if __name__ == "__main__":
    for layout in sys.argv[1:]:
        make(layout)
