"""Embed a dataset split or a folder of images with a trained model and save the features (`reid-extract`).

    reid-extract --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --split query --output feats/query.npz \\
        MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth
    reid-extract --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --image-dir my_photos/ --output feats/mine \\
        --format npy MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth
    reid-extract --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml --split gallery --num-gpus 4 \\
        --output feats/gallery.npz MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth      # 4 workers

The output holds L2-normalized float32 features with the image paths, pids and camids,
row i for the i-th image of the split (or of the sorted folder listing; pid and camid
are -1 there). A split of a video set gives one feature per tracklet, as the evaluation
computes it, with the tracklet's first frame as its path. Several workers each embed a
contiguous shard and the main worker writes the merged result, in input order.
MODEL.WEIGHTS may be an exported file (reid-export): a .onnx file runs with ONNX Runtime
(--backend onnxruntime, the default for .onnx files), an OpenVINO IR .xml file with
OpenVINO (--backend openvino, the default for .xml files; it runs .onnx files too), on
the CPU, preprocessed as the file's contract says (image sets only). Read the output back with
`reid_engine.inference.load_features(path)` or plain `numpy.load`.
"""
import argparse
import logging
from typing import List, Optional

from ..config import CfgNode
from ..engine.launch import launch
from ..inference import (
    BACKENDS,
    FEATURE_FORMATS,
    SPLITS,
    DefaultPredictor,
    Item,
    collect_items,
    extract_shard_features,
    gather_features,
    inference_config,
    resolve_backend,
    save_features,
)
from ..runtime.run_plan import build_run_plan
from ..utils import comm
from ..utils.errors import UsageError
from ..utils.logger import setup_logger
from .base import build_config, command_parser, launch_options
from .boundary import run_command

__all__ = ["PROG", "build_parser", "extract_worker", "run", "main"]

PROG = "reid-extract"
logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The shared base with the launch flags, plus the extraction flags."""
    parser = command_parser(PROG, __doc__, launches=True)
    parser.add_argument("--split", choices=SPLITS, help="dataset split to embed")
    parser.add_argument("--dataset", default="", help="registered dataset name (default: DATASETS.TESTS[0])")
    parser.add_argument("--image-dir", default="", help="embed every image under this folder (recursive) instead")
    parser.add_argument("--output", required=True, help="output file (.npz, or .npy + .json with --format npy)")
    parser.add_argument("--format", choices=FEATURE_FORMATS, default="npz",
                        help="npz: one file; npy: features .npy plus an index .json (default: npz)")
    parser.add_argument("--backend", choices=BACKENDS,
                        help="pytorch (a .pth checkpoint), onnxruntime (an exported .onnx file) or openvino "
                             "(an exported .xml or .onnx file); default: from MODEL.WEIGHTS' extension")
    return parser


def extract_worker(cfg: CfgNode, items: List[Item], output: str, fmt: str, source: str,
                   backend: Optional[str] = None) -> None:
    """One worker: embed its shard; the main worker gathers all shards and writes the file."""
    if comm.get_world_size() > 1:  # a spawned worker starts without logging handlers
        setup_logger(distributed_rank=comm.get_rank())
    plan = build_run_plan(cfg, purpose="serve", log=False)
    if plan.device.type == "cpu":
        plan.apply_threads()  # CPU workers share the CPUs the process may use instead of each using all
    predictor = DefaultPredictor(cfg, backend=backend)
    begin, features = extract_shard_features(predictor, items)
    merged = gather_features(begin, features, len(items))
    if merged is not None:
        written = save_features(output, merged, items, fmt, source)
        logger.info("Wrote %d features of dimension %d to %s", merged.shape[0], merged.shape[1], ", ".join(written))
    comm.synchronize()


def run(args: argparse.Namespace) -> None:
    """Check the request in this process (one-line errors), then run the workers."""
    if bool(args.split) == bool(args.image_dir):
        raise UsageError("nothing or too much to embed (--split, --image-dir): "
                         "pass exactly one of --split {train,query,gallery} or --image-dir DIR")
    setup_logger()
    cfg = build_config(args)
    backend = resolve_backend(cfg.MODEL.WEIGHTS, args.backend)
    if backend == "pytorch":
        cfg = inference_config(cfg)  # reads the checkpoint once, here
    items = collect_items(cfg, args.split, args.dataset, args.image_dir)
    source = args.image_dir or f"{args.dataset or cfg.DATASETS.TESTS[0]}/{args.split}"
    device = build_run_plan(cfg, purpose="serve", log=False).device
    launch(extract_worker, args.num_gpus, args=(cfg, items, args.output, args.format, source, backend),
           **launch_options(args, device.type))


def main(argv: Optional[List[str]] = None) -> int:
    """Run `reid-extract` with `argv` (default: sys.argv[1:]); returns the exit status."""
    return run_command(PROG, build_parser(), run, argv)
