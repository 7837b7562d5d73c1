#!/usr/bin/env python
"""Embed a dataset split or a folder of images with a trained model and save the features.

    python tools/extract_features.py --config-file cfg.yml --split query --output feats/query.npz \\
        MODEL.WEIGHTS output/model_final.pth
    python tools/extract_features.py --config-file cfg.yml --image-dir my_photos/ --output feats/mine \\
        --format npy MODEL.WEIGHTS output/model_final.pth
    python tools/extract_features.py --config-file cfg.yml --split gallery --num-gpus 4 \\
        --output feats/gallery.npz MODEL.WEIGHTS output/model_final.pth      # 4 workers

The output holds L2-normalised float32 features with the image paths, pids and camids,
row i for the i-th image of the split (or of the sorted folder listing; pid and camid
are -1 there). Several workers each embed a contiguous shard and the main worker writes
the merged result, in input order. Read it back with
`reid_engine.engine.inference_tools.load_features(path)` or plain `numpy.load`.
"""
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch  # noqa: E402

from reid_engine.engine.cli import build_config  # noqa: E402
from reid_engine.engine.defaults import default_argument_parser  # noqa: E402
from reid_engine.engine.inference_tools import (  # noqa: E402
    FEATURE_FORMATS,
    SPLITS,
    ToolError,
    collect_items,
    extract_shard_features,
    gather_features,
    inference_config,
    run_tool,
    save_features,
)
from reid_engine.engine.launch import launch  # noqa: E402
from reid_engine.engine.predictor import DefaultPredictor  # noqa: E402
from reid_engine.utils import comm  # noqa: E402
from reid_engine.utils.env import resolve_device  # noqa: E402
from reid_engine.utils.logger import setup_logger  # noqa: E402

PROG = "extract_features"
logger = logging.getLogger("reid_engine.tools.extract_features")


def build_parser():
    """`default_argument_parser()` plus the extraction flags."""
    parser = default_argument_parser(epilog=__doc__)
    parser.add_argument("--split", choices=SPLITS, help="dataset split to embed")
    parser.add_argument("--dataset", default="", help="registered dataset name (default: DATASETS.TESTS[0])")
    parser.add_argument("--image-dir", default="", help="embed every image under this folder (recursive) instead")
    parser.add_argument("--output", required=True, help="output file (.npz, or .npy + .json with --format npy)")
    parser.add_argument("--format", choices=FEATURE_FORMATS, default="npz",
                        help="npz: one file; npy: features .npy plus an index .json (default: npz)")
    return parser


def worker(cfg, items, output: str, fmt: str, source: str) -> None:
    """One worker: embed its shard; the main worker gathers all shards and writes the file."""
    if comm.get_world_size() > 1:  # a spawned worker starts without logging handlers
        setup_logger(distributed_rank=comm.get_rank())
    if comm.get_world_size() > 1 and resolve_device(cfg.MODEL.DEVICE).type == "cpu":
        # CPU workers share the machine's cores instead of each using all of them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // comm.get_local_size()))
    predictor = DefaultPredictor(cfg)
    begin, features = extract_shard_features(predictor, items)
    merged = gather_features(begin, features, len(items))
    if merged is not None:
        written = save_features(output, merged, items, fmt, source)
        logger.info("Wrote %d features of dimension %d to %s", merged.shape[0], merged.shape[1], ", ".join(written))
    comm.synchronize()


def main(args) -> None:
    """Check the request in this process (one-line errors), then run the workers."""
    if bool(args.split) == bool(args.image_dir):
        raise ToolError("pass exactly one of --split {train,query,gallery} or --image-dir DIR")
    cfg = inference_config(build_config(args))  # reads the checkpoint once, here
    items = collect_items(cfg, args.split, args.dataset, args.image_dir)
    source = args.image_dir or f"{args.dataset or cfg.DATASETS.TESTS[0]}/{args.split}"
    device = resolve_device(cfg.MODEL.DEVICE)
    launch(worker, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
           dist_url=args.dist_url, args=(cfg, items, args.output, args.format, source),
           backend="nccl" if device.type == "cuda" else "gloo")


if __name__ == "__main__":
    setup_logger()
    sys.exit(run_tool(PROG, main, build_parser().parse_args()))
