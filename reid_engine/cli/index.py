"""Index a gallery once and find a person in it by image (`reid-index build | add | search | info | evaluate`).

    reid-index build --index gallery.rindex --image-dir crops/ \\
        --config-file configs/SyntheticReID/bagtricks_R18_quick.yml MODEL.WEIGHTS output/synthetic_r18/model_final.pth
    reid-index add --index gallery.rindex --list new_crops.csv \\
        --config-file configs/SyntheticReID/bagtricks_R18_quick.yml MODEL.WEIGHTS output/synthetic_r18/model_final.pth
    reid-index search --index gallery.rindex --query person.jpg --topk 10 --vis-dir vis/ --output hits.json \\
        --config-file configs/SyntheticReID/bagtricks_R18_quick.yml MODEL.WEIGHTS output/synthetic_r18/model_final.pth
    reid-index search --index gallery.rindex --query-features query.npz --exclude-same-camera
    reid-index info --index gallery.rindex

The index is one file (faiss, the default) or a Milvus collection (--backend milvus; the
server is --milvus-uri, else $REID_MILVUS_URI, else a Milvus Lite file milvus_gallery.db).
It keeps each item's path, identity, camera, time and track id, and its model's contract:
queries of another model, or features of another dimension, are refused. Items come from a
dataset split (--split, --dataset), an image folder (--image-dir), a list file (--list: CSV
with a header naming path and any of pid, camid, time, trackid) or a reid-extract feature
file (--features). MODEL.WEIGHTS is a .pth checkpoint or an exported .onnx / .xml file.
A build embeds in chunks kept in INDEX.partial/: stopped (SIGTERM, a kill), it leaves the
previous index as it was, and the same command continues where it stopped. Galleries of
more than 50,000 items get an approximate (IVF) index tuned to --recall-target.
Config overrides (KEY VALUE) come last; several query images: --query a.jpg,b.jpg (or repeat
--query).
"""
import argparse
import json
import logging
import sys
from typing import List, Optional

from ..config import CfgNode
from ..gallery import (
    DEFAULT_CHUNK,
    DEFAULT_RECALL_TARGET,
    DEFAULT_RERANK_CANDIDATES,
    INDEX_BACKENDS,
    INDEX_KINDS,
    Embedder,
    Location,
    Records,
    SearchFilter,
    add_to_index,
    approximate_recall,
    build_index,
    collect_gallery,
    draw_results,
    evaluate_with_index,
    feature_file_contract,
    open_index,
    parse_where,
    query_filter,
    read_feature_file,
    read_list_file,
    search_index,
    stop_on_sigterm,
)
from ..inference import SPLITS
from ..utils.errors import UsageError
from ..utils.file_io import atomic_write_text
from ..utils.logger import setup_logger
from .args import add_config_arguments, comma_list, positive_int
from .base import build_config, command_parser
from .boundary import run_command

__all__ = ["PROG", "ACTIONS", "build_parser", "run", "main"]

PROG = "reid-index"
ACTIONS = ("build", "add", "search", "info", "evaluate")
logger = logging.getLogger(__name__)


def _location_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error too (or REID_DEBUG=1)")
    parser.add_argument("--index", required=True, help="the index: a file (faiss) or a collection name (milvus)")
    parser.add_argument("--backend", choices=INDEX_BACKENDS, default="faiss", help="faiss (default) or milvus")
    parser.add_argument("--milvus-uri", default="", help="Milvus: a Milvus Lite .db file or http://host:19530 "
                        "(default: $REID_MILVUS_URI, else milvus_gallery.db)")
    parser.add_argument("--milvus-token", default="", help="Milvus: user:password or API key ($REID_MILVUS_TOKEN)")


def _input_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", choices=SPLITS, help="index a split of --dataset (default: DATASETS.TESTS[0])")
    parser.add_argument("--dataset", default="", help="registered dataset name")
    parser.add_argument("--image-dir", default="", help="index every image under this folder (recursive)")
    parser.add_argument("--list", default="", dest="list_file", help="index a list file (CSV: path,camid,time,...)")
    parser.add_argument("--features", default="", help="index a reid-extract feature file (no model needed)")
    parser.add_argument("--chunk-size", type=positive_int, default=DEFAULT_CHUNK,
                        help=f"items per resumable chunk (default {DEFAULT_CHUNK})")


def build_parser() -> argparse.ArgumentParser:
    """The command with one sub-command per action, each with its flags and the trailing config overrides."""
    parser = command_parser(PROG, __doc__, config=False)
    actions = parser.add_subparsers(dest="action", required=True, metavar="{" + ",".join(ACTIONS) + "}")
    build = actions.add_parser("build", help="embed a gallery and write a new index (resumable)")
    add = actions.add_parser("add", help="embed new items and append them to an index")
    search = actions.add_parser("search", help="top-k of query images or feature files, as JSON and pictures")
    info = actions.add_parser("info", help="print the index's size, fields, index parameters and model")
    evaluate = actions.add_parser("evaluate", help="mAP / CMC of a query split through the index, and recall@k")
    for sub in (build, add, search, info, evaluate):
        _location_flags(sub)
    for sub in (build, add):
        _input_flags(sub)
    build.add_argument("--index-type", choices=INDEX_KINDS, default="auto",
                       help="auto (exact up to 50,000 items, else IVF), flat, ivf or hnsw")
    build.add_argument("--recall-target", type=float, default=DEFAULT_RECALL_TARGET,
                       help=f"recall@10 against exact search of an approximate index (default {DEFAULT_RECALL_TARGET})")
    search.add_argument("--query", type=comma_list(what="query image"), action="extend", default=[],
                        help="query image files: one, or a comma list (repeatable)")
    search.add_argument("--query-features", default="", help="queries from a reid-extract feature file")
    search.add_argument("--query-list", default="", help="queries from a list file (CSV: path,camid,time,...)")
    search.add_argument("--query-camid", type=int, default=None, help="the camera of the --query images")
    search.add_argument("--topk", type=positive_int, default=10, help="hits per query (default 10)")
    search.add_argument("--exclude-same-camera", action="store_true", help="leave out items of the query's camera")
    search.add_argument("--time-window", nargs=2, type=float, metavar=("START", "END"),
                        help="only items with START <= time <= END")
    search.add_argument("--where", action="append", default=[], help="metadata condition FIELD OP NUMBER, e.g. "
                        "'camid != 3' (repeatable; ANDed)")
    search.add_argument("--rerank", action="store_true", help="k-reciprocal re-ranking of the returned candidates")
    search.add_argument("--rerank-candidates", type=positive_int, default=DEFAULT_RERANK_CANDIDATES,
                        help=f"candidates re-ranked per query (default {DEFAULT_RERANK_CANDIDATES})")
    search.add_argument("--exact", action="store_true", help="exact search even on an approximate index")
    search.add_argument("--output", default="", help="write the hits as JSON here (default: print them)")
    search.add_argument("--vis-dir", default="", help="write one rank-list PNG per query here")
    evaluate.add_argument("--query-features", default="", help="queries (with pids, camids) from a feature file")
    evaluate.add_argument("--split", choices=SPLITS, default="query", help="the query split of --dataset")
    evaluate.add_argument("--dataset", default="", help="registered dataset name (default: DATASETS.TESTS[0])")
    evaluate.add_argument("--recall-k", type=positive_int, default=10, help="k of the reported recall@k")
    evaluate.add_argument("--output", default="", help="write the figures as JSON here (default: print them)")
    for sub in (build, add, search, evaluate):
        add_config_arguments(sub)
    return parser


def _location(args: argparse.Namespace) -> Location:
    return Location(args.index, args.backend, args.milvus_uri, args.milvus_token)


def _model_config(args: argparse.Namespace) -> Optional[CfgNode]:
    """The config when a model is given (--config-file or MODEL.WEIGHTS among the overrides), else None."""
    return build_config(args) if (args.config_file or args.opts) else None


def _gallery_job(args: argparse.Namespace):
    """(embed function, items, records, contract dict) of a build or add."""
    if args.features:
        if args.split or args.image_dir or args.list_file:
            raise UsageError("--features and --split / --image-dir / --list: pass one source of items")
        features, records = read_feature_file(args.features)
        contract = feature_file_contract(features, args.features).to_dict()
        return (lambda chunk: features[chunk[0]:chunk[-1] + 1]), list(range(len(features))), records, contract
    cfg = build_config(args)
    items, records = collect_gallery(cfg, args.split or "", args.dataset, args.image_dir, args.list_file)
    embedder = Embedder(cfg, args.config_file)
    return embedder.embed_items, items, records, embedder.contract.to_dict()


def _queries(args: argparse.Namespace, index):
    """(features, records, names) of the queries, checked against the index's model."""
    sources = [bool(args.query), bool(args.query_features), bool(args.query_list)]
    if sum(sources) != 1:
        raise UsageError("no or several query sources (--query, --query-features, --query-list): pass exactly one")
    if args.query_features:
        features, records = read_feature_file(args.query_features)
        index.check_query(None, features.shape[1], f"--query-features {args.query_features}")
        return features, records, list(records.path)
    records = read_list_file(args.query_list) if args.query_list else Records.from_columns(
        {"path": args.query, "camid": [args.query_camid if args.query_camid is not None else -1] * len(args.query)})
    cfg = _model_config(args)
    if cfg is None:
        raise UsageError("query images need the index's model: pass --config-file and/or MODEL.WEIGHTS (reid-index "
                         "info shows which), or use --query-features")
    embedder = Embedder(cfg, args.config_file)
    index.check_query(embedder.contract, int(embedder.contract.feature_dim), "the query model")
    return embedder.embed_images(list(records.path)), records, list(records.path)


def _search(args: argparse.Namespace) -> None:
    index = open_index(_location(args))
    base = SearchFilter(tuple(parse_where(args.where)))
    base.check_fields(index.manifest.fields)  # before any image is embedded
    features, records, names = _queries(args, index)
    window = tuple(args.time_window) if args.time_window else None
    filters = [query_filter(base, int(records.camid[q]), args.exclude_same_camera, window) for q in range(len(names))]
    result = search_index(index, features, args.topk, filters, args.rerank, args.rerank_candidates, args.exact)
    _write_json(args.output, {"index": index.location, "topk": args.topk, "rerank": bool(args.rerank),
                              "results": result.to_json(names)}, f"the hits of {len(names)} queries")
    if args.vis_dir:
        for path in draw_results(args.vis_dir, result, records, names):
            logger.info("Wrote %s", path)


def _evaluate(args: argparse.Namespace) -> None:
    index = open_index(_location(args))
    if args.query_features:
        features, records = read_feature_file(args.query_features)
        index.check_query(None, features.shape[1], f"--query-features {args.query_features}")
    else:
        cfg = build_config(args)
        items, records = collect_gallery(cfg, args.split, args.dataset)
        embedder = Embedder(cfg, args.config_file)
        index.check_query(embedder.contract, int(embedder.contract.feature_dim), "the query model")
        features = embedder.embed_items(items, what="Embedding the queries")
    metrics = evaluate_with_index(index, features, records.pid, records.camid)
    report = {"mAP": metrics["mAP"], "mINP": metrics["mINP"],
              "cmc": {f"rank-{r}": float(metrics["cmc"][r - 1]) for r in (1, 5, 10) if r <= len(metrics["cmc"])},
              "index": index.manifest.plan.kind}
    if index.manifest.plan.kind != "flat":
        report[f"recall@{args.recall_k}"] = approximate_recall(index, features, args.recall_k)
    _write_json(args.output, report, f"the figures of {len(features)} queries")


def _write_json(output: str, data: dict, what: str) -> None:
    """Write `data` as JSON to `output` (atomically), or print it when no file is given."""
    text = json.dumps(data, indent=1) + "\n"
    if output:
        atomic_write_text(output, text)
        logger.info("Wrote %s to %s", what, output)
    else:
        sys.stdout.write(text)


def run(args: argparse.Namespace) -> None:
    """Carry out the action."""
    setup_logger()
    location = _location(args)
    if args.action in ("build", "add"):
        embed, items, records, contract = _gallery_job(args)
        with stop_on_sigterm():
            if args.action == "build":
                build_index(location, embed, items, records, contract, args.index_type, args.recall_target,
                            args.chunk_size)
            else:
                add_to_index(location, embed, items, records, contract, args.chunk_size)
    elif args.action == "search":
        _search(args)
    elif args.action == "info":
        print(json.dumps(open_index(location).info(), indent=1))
    else:
        _evaluate(args)


def main(argv: Optional[List[str]] = None) -> int:
    """Run `reid-index` with `argv` (default: sys.argv[1:]); returns the exit status."""
    return run_command(PROG, build_parser(), run, argv)

