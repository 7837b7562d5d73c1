"""Helpers of the inference, export and command-line tests: the tiny config."""

TINY_NUM_CLASSES = 24  # training identities of SyntheticReIDTiny


def tiny_opts(data_root: str, weights: str = ""):
    """KEY VALUE overrides of a tiny CPU model on SyntheticReIDTiny (64 x 32 images)."""
    return [
        "MODEL.DEVICE", "cpu",
        "MODEL.BACKBONE.DEPTH", "18x",
        "MODEL.BACKBONE.PRETRAIN", False,
        "INPUT.SIZE_TEST", [64, 32],
        "DATASETS.ROOT", data_root,
        "DATASETS.TESTS", ("SyntheticReIDTiny",),
        "DATALOADER.NUM_WORKERS", 0,
        "TEST.IMS_PER_BATCH", 32,
        "MODEL.WEIGHTS", weights,
    ]


def tiny_cfg(data_root: str, weights: str = "", extra=()):
    """The frozen tiny config (see `tiny_opts`) plus `extra` overrides."""
    from reid_engine.config import get_cfg

    cfg = get_cfg()
    cfg.merge_from_list(tiny_opts(data_root, weights) + list(extra))
    cfg.freeze()
    return cfg
