"""ReidEvaluator: collects features and ids, gathers them to rank 0, reports ReID metrics."""
import json
import logging
import os
import time
from collections import OrderedDict
from typing import Optional

import torch

from reid_engine.utils import comm

from .distance import iter_distance_chunks
from .evaluator import DatasetEvaluator
from .query_expansion import alpha_query_expansion
from .rank import RankAccumulator
from .rerank import iter_rerank_chunks
from .roc import DEFAULT_FPRS, RocAccumulator, roc_key

__all__ = ["ReidEvaluator"]

logger = logging.getLogger(__name__)


class ReidEvaluator(DatasetEvaluator):
    """Evaluates a test set laid out as ``num_query`` query items followed by the gallery.

    The only reader of TEST.METRIC, TEST.AQE, TEST.RERANK and TEST.ROC. Each worker
    sees a contiguous shard of the test set (InferenceSampler); rank 0 concatenates
    the shards in rank order, which restores the single-process order, so results
    are identical to a one-process run.
    """

    def __init__(self, cfg, num_query: int, output_dir: Optional[str] = None):
        """
        Args:
            cfg: config (TEST.* is read).
            num_query: number of query items at the start of the test set.
            output_dir: when given, rank 0 also writes the results to
                ``<output_dir>/reid_results.json``.
        """
        self.cfg = cfg
        self.num_query = int(num_query)
        self.output_dir = output_dir
        self.metric = cfg.TEST.METRIC
        self.aqe = (cfg.TEST.AQE.ENABLED, cfg.TEST.AQE.QE_TIME, cfg.TEST.AQE.QE_K, cfg.TEST.AQE.ALPHA)
        self.rerank = (cfg.TEST.RERANK.ENABLED, cfg.TEST.RERANK.K1, cfg.TEST.RERANK.K2, cfg.TEST.RERANK.LAMBDA)
        self.roc = cfg.TEST.ROC.ENABLED
        self.reset()

    def reset(self) -> None:
        """Forget the collected batches."""
        self._features, self._pids, self._camids = [], [], []
        #: after evaluate(), on the main process: (features (N, D), pids (N,), camids (N,)) of
        #: the whole test set, queries first; for pictures drawn from them (TEST.RANK_VIS)
        self.collected = None

    def process(self, inputs, outputs) -> None:
        """Store a batch's features (moved to CPU, float32), pids (``inputs["targets"]``) and camids."""
        self._features.append(outputs.detach().to("cpu", torch.float32))
        self._pids.append(torch.as_tensor(inputs["targets"]).detach().cpu().to(torch.int64).reshape(-1))
        self._camids.append(torch.as_tensor(inputs["camids"]).detach().cpu().to(torch.int64).reshape(-1))

    def _collect(self):
        """Concatenate this worker's batches; in distributed runs gather all shards on rank 0."""
        local = (
            torch.cat(self._features) if self._features else torch.empty(0, 0),
            torch.cat(self._pids) if self._pids else torch.empty(0, dtype=torch.int64),
            torch.cat(self._camids) if self._camids else torch.empty(0, dtype=torch.int64),
        )
        if comm.get_world_size() == 1:
            return local
        comm.synchronize()
        shards = comm.gather(local, dst=0)
        if not comm.is_main_process():
            return None
        shards = [s for s in shards if s[0].numel()]
        return tuple(torch.cat([s[i] for s in shards]) for i in range(3))

    def evaluate(self):
        """Compute the metrics (rank 0) as an OrderedDict in percent; {} on other ranks."""
        collected = self._collect()
        if collected is None:
            return {}
        features, pids, camids = collected
        if features.shape[0] <= self.num_query:
            raise ValueError(
                f"collected {features.shape[0]} features for {self.num_query} queries: the gallery is empty; "
                "check the test loader (query items first, then gallery)"
            )
        if not (features.shape[0] == pids.numel() == camids.numel()):
            raise ValueError(f"{features.shape[0]} features but {pids.numel()} pids and {camids.numel()} camids")
        self.collected = (features, pids, camids)
        qf, gf = features[: self.num_query], features[self.num_query:]
        q_pids, g_pids = pids[: self.num_query], pids[self.num_query:]
        q_camids, g_camids = camids[: self.num_query], camids[self.num_query:]
        start = time.perf_counter()

        aqe_on, qe_time, qe_k, alpha = self.aqe
        if aqe_on:
            logger.info("Applying alpha query expansion (QE_TIME=%d, QE_K=%d, ALPHA=%.2f)", qe_time, qe_k, alpha)
            qf, gf = alpha_query_expansion(qf, gf, qe_time, qe_k, alpha)
        rerank_on, k1, k2, lambda_value = self.rerank
        if rerank_on:
            logger.info("Applying k-reciprocal re-ranking (K1=%d, K2=%d, LAMBDA=%.2f)", k1, k2, lambda_value)
            blocks = iter_rerank_chunks(qf, gf, k1, k2, lambda_value, self.metric)
        else:
            blocks = iter_distance_chunks(qf, gf, self.metric)

        ranks = RankAccumulator(q_pids, g_pids, q_camids, g_camids, max_rank=50)
        roc = RocAccumulator(q_pids, g_pids, q_camids, g_camids, DEFAULT_FPRS) if self.roc else None
        for first_row, dist in blocks:
            ranks.update(first_row, dist)
            if roc is not None:
                roc.update(first_row, dist)
        cmc, mean_ap, mean_inp = ranks.summarize()

        results = OrderedDict()
        for r in (1, 5, 10):
            results[f"Rank-{r}"] = float(cmc[r - 1]) * 100
        results["mAP"] = mean_ap * 100
        results["mINP"] = mean_inp * 100
        results["metric"] = (mean_ap + float(cmc[0])) / 2 * 100
        if roc is not None:
            for fpr, tpr in roc.summarize().items():
                results[roc_key(fpr)] = tpr * 100
        logger.info("Metrics of %d queries x %d gallery items computed in %.2f s",
                    len(q_pids), len(g_pids), time.perf_counter() - start)
        if self.output_dir:
            os.makedirs(self.output_dir, exist_ok=True)
            with open(os.path.join(self.output_dir, "reid_results.json"), "w") as f:
                json.dump(results, f, indent=2)
        return results
