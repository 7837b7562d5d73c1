"""Evaluation: the evaluator protocol, the inference loop, and exact ReID metrics.

See docs/internals.md for the contract and reid-protocol.md for the definitions.
"""
from .distance import compute_distance_matrix, iter_distance_chunks
from .evaluator import (
    DatasetEvaluator,
    DatasetEvaluators,
    ExpectedResultsError,
    flip_averaged,
    inference_context,
    inference_on_dataset,
    log_result_checks,
    parse_csv_format,
    print_csv_format,
    result_check_failures,
    verify_results,
)
from .query_expansion import alpha_query_expansion
from .rank import NoValidQueryError, RankAccumulator, evaluate_rank, evaluate_rank_from_features
from .reid_evaluation import ReidEvaluator
from .rerank import iter_jaccard_distance, iter_rerank_chunks, k_reciprocal_rerank
from .roc import RocAccumulator

__all__ = [
    "DatasetEvaluator",
    "DatasetEvaluators",
    "ExpectedResultsError",
    "NoValidQueryError",
    "RankAccumulator",
    "ReidEvaluator",
    "RocAccumulator",
    "alpha_query_expansion",
    "compute_distance_matrix",
    "evaluate_rank",
    "evaluate_rank_from_features",
    "flip_averaged",
    "inference_context",
    "inference_on_dataset",
    "iter_distance_chunks",
    "iter_rerank_chunks",
    "iter_jaccard_distance",
    "k_reciprocal_rerank",
    "log_result_checks",
    "parse_csv_format",
    "print_csv_format",
    "result_check_failures",
    "verify_results",
]
