#!/usr/bin/env python
"""Track people through synthetic sequences with a BoxMOT tracker, with our ReID model and on motion alone.

    python tools/track_synthetic.py --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml \\
        MODEL.WEIGHTS output/synthetic_r18_half/model_final.pth

Renders --seeds sequences of SyntheticReID's test identities walking in pairs that meet and
mostly turn back (`reid_engine.data.synthetic.sequence`), exports the model for BoxMOT
(`reid-export --format boxmot`), and runs the tracker (--tracker, Deep OC-SORT by default)
twice on each sequence's ground-truth boxes (jittered by --jitter of their size, as from a
detector): with the exported model as its appearance encoder, and on motion alone (the same
tracker and settings without embeddings). Prints IDF1 (mean and per sequence), ID switches
(total) and MOTA (mean) of both, from py-motmetrics. Needs boxmot (installed with --no-deps,
see docs/boxmot.md) and motmetrics.

The export uses TEST.NECK_FEAT after (override it after MODEL.WEIGHTS): trackers threshold
absolute cosine distances, and the BN-neck features are centred, while the pooled features
before it (the main job's test feature, best for ranking) are averages of ReLU outputs, at
cosine 0.97-0.99 between any two people.
"""
import argparse
import os
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reid_engine.cli.base import build_config, command_parser, positive_int  # noqa: E402
from reid_engine.cli.boundary import run_command  # noqa: E402
from reid_engine.data.synthetic.sequence import SequenceSpec, SyntheticSequence, render_sequence  # noqa: E402
from reid_engine.export.boxmot import require_boxmot_runtime  # noqa: E402
from reid_engine.utils.errors import UsageError, require_module  # noqa: E402

PROG = "track_synthetic"

Frames = List[Tuple[np.ndarray, np.ndarray]]  # per frame: (ids (n,), boxes (n, 4) x1 y1 x2 y2)


def iou_distance(gt: np.ndarray, hyp: np.ndarray, max_distance: float = 0.5) -> np.ndarray:
    """(n, m) 1 - IoU of xyxy boxes, NaN (no match allowed) above `max_distance` (IoU below 0.5).

    motmetrics 1.4's own `iou_matrix` calls np.asfarray, which numpy 2 removed.
    """
    gt, hyp = np.asarray(gt, dtype=np.float64).reshape(-1, 4), np.asarray(hyp, dtype=np.float64).reshape(-1, 4)
    lt = np.maximum(gt[:, None, :2], hyp[None, :, :2])
    rb = np.minimum(gt[:, None, 2:], hyp[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_gt, area_hyp = (np.prod(b[:, 2:] - b[:, :2], axis=1) for b in (gt, hyp))
    dist = 1.0 - inter / (area_gt[:, None] + area_hyp[None, :] - inter)
    dist[dist > max_distance] = np.nan
    return dist


def mot_metrics(truth: Frames, tracks: Frames) -> Dict[str, float]:
    """IDF1, ID switches and MOTA of `tracks` against `truth` (frame by frame, IoU >= 0.5 matches)."""
    mm = require_module("motmetrics", "computing the MOT metrics", "motmetrics")
    acc = mm.MOTAccumulator(auto_id=True)
    for (gt_ids, gt_boxes), (hyp_ids, hyp_boxes) in zip(truth, tracks):
        acc.update(list(gt_ids), list(hyp_ids), iou_distance(gt_boxes, hyp_boxes))
    summary = mm.metrics.create().compute(acc, metrics=["idf1", "num_switches", "mota"], name="run")
    row = summary.loc["run"]
    return {"idf1": float(row["idf1"]), "id_switches": int(row["num_switches"]), "mota": float(row["mota"])}


def ground_truth(sequence: SyntheticSequence) -> Frames:
    """The sequence's (ids, boxes) per frame."""
    return list(zip(sequence.ids, sequence.boxes))


def jittered(boxes: Sequence[np.ndarray], jitter: float, seed: int = 0) -> List[np.ndarray]:
    """The boxes with each side moved by a normal draw of `jitter` times the box size (a detector's noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for frame in boxes:
        size = np.tile(frame[:, 2:] - frame[:, :2], 2)  # w, h, w, h
        out.append((frame + rng.normal(0.0, jitter, size=frame.shape) * size).astype(np.float32))
    return out


#: the trackers this tool runs: BoxMOT class, its options that switch camera-motion compensation off
#: (the synthetic camera does not move)
TRACKERS = {"botsort": ("BotSort", {"use_cmc": False}), "deepocsort": ("DeepOcSort", {"cmc_off": True})}


def make_tracker(name: str = "botsort", reid_weights: Optional[str] = None):
    """BoxMOT tracker `name` (a key of TRACKERS) with `reid_weights` as its appearance encoder, or on
    motion alone (None: the same tracker and settings without embeddings)."""
    boxmot = require_module("boxmot", "tracking with BoxMOT", "--no-deps -r requirements-nodeps.txt")
    from pathlib import Path

    class_name, options = TRACKERS[name]
    if reid_weights is None:
        return getattr(boxmot, class_name)(use_embeddings=False, **options)
    require_boxmot_runtime()  # else loading the encoder pip-installs BoxMOT's onnxruntime here
    return getattr(boxmot, class_name)(reid_weights=Path(reid_weights), device="cpu", half=False, **options)


def run_tracker(tracker, sequence: SyntheticSequence, detections: Sequence[np.ndarray]) -> Frames:
    """Feed the frames (as BGR) and `detections` to a BoxMOT tracker; its (ids, boxes) per frame."""
    out = []
    for frame, boxes in zip(sequence.frames, detections):
        dets = np.concatenate([boxes, np.full((len(boxes), 1), 0.9), np.zeros((len(boxes), 1))], axis=1)
        tracks = tracker.update(dets.astype(np.float32), np.ascontiguousarray(frame[:, :, ::-1]))
        tracks = np.asarray(tracks).reshape(-1, 8)
        out.append((tracks[:, 4].astype(np.int64), tracks[:, :4].astype(np.float32)))
    return out


def compare(sequence: SyntheticSequence, reid_weights: str, tracker: str = "botsort", jitter: float = 0.03,
            seed: int = 0) -> Dict[str, dict]:
    """Metrics of `tracker` with the encoder of `reid_weights` ("reid") and on motion alone ("motion"),
    on the same detections."""
    detections = jittered(sequence.boxes, jitter, seed)
    truth = ground_truth(sequence)
    return {mode: mot_metrics(truth, run_tracker(make_tracker(tracker, weights), sequence, detections))
            for mode, weights in (("reid", reid_weights), ("motion", None))}


def format_table(tracker: str, runs: Sequence[Dict[str, dict]]) -> str:
    """The `compare` results of several sequences as one table: a row per mode."""
    from tabulate import tabulate

    rows = []
    for mode, label in (("reid", f"{tracker} + reid_engine model"), ("motion", f"{tracker}, motion only")):
        idf1 = [100 * run[mode]["idf1"] for run in runs]
        rows.append([label, f"{np.mean(idf1):.1f}", " ".join(f"{v:.1f}" for v in idf1),
                     sum(run[mode]["id_switches"] for run in runs),
                     f"{100 * np.mean([run[mode]['mota'] for run in runs]):.1f}"])
    return tabulate(rows, headers=["tracker", "IDF1 %", "IDF1 % per sequence", "ID switches", "MOTA %"],
                    tablefmt="github")


def build_parser() -> argparse.ArgumentParser:
    """--config-file and KEY VALUE overrides (MODEL.WEIGHTS), plus the sequence's settings."""
    parser = command_parser(PROG, __doc__)
    parser.add_argument("--output", default="", help="folder for the BoxMOT export (default: a temporary one)")
    parser.add_argument("--pairs", type=positive_int, default=SequenceSpec.num_pairs, help="pairs of people")
    parser.add_argument("--frames", type=positive_int, default=SequenceSpec.num_frames, help="frames")
    parser.add_argument("--seeds", type=positive_int, default=3, help="sequences, with seeds 0 .. N-1")
    parser.add_argument("--tracker", choices=sorted(TRACKERS), default="deepocsort", help="the BoxMOT tracker")
    parser.add_argument("--jitter", type=float, default=0.03, help="box noise, a fraction of the box size")
    return parser


def run(args: argparse.Namespace) -> None:
    """Export the model, render the sequence, track it both ways and print the table."""
    from reid_engine.export.verify import export_model
    from reid_engine.utils.logger import setup_logger

    setup_logger()
    args.opts = ["TEST.NECK_FEAT", "after"] + list(args.opts or [])  # the user's opts come after: they win
    cfg = build_config(args)
    if not cfg.MODEL.WEIGHTS:
        raise UsageError("no model (MODEL.WEIGHTS): pass MODEL.WEIGHTS path/to/model_final.pth, e.g. of "
                         "tools/train_net.py --config-file configs/SyntheticReID/bagtricks_R18-half-ibn.yml")
    with tempfile.TemporaryDirectory() as tmp:
        weights = export_model(cfg, args.output or tmp, formats=("boxmot",))["boxmot"]["path"]
        runs = [compare(render_sequence(SequenceSpec(num_pairs=args.pairs, num_frames=args.frames, seed=seed)),
                        weights, args.tracker, args.jitter, seed) for seed in range(args.seeds)]
    print(f"{args.seeds} sequences of {args.frames} frames, {2 * args.pairs} people each, box jitter {args.jitter:g}")
    print(format_table(args.tracker, runs))


def main(argv: Optional[List[str]] = None) -> int:
    """Run the tool with `argv` (default: sys.argv[1:]); returns the exit status."""
    return run_command(PROG, build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
