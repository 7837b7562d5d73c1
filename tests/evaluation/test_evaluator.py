"""Inference loop, evaluator protocol, ReidEvaluator, printing and checking results."""
import json
import logging

import pytest
import torch
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.evaluation import (
    DatasetEvaluator,
    DatasetEvaluators,
    ReidEvaluator,
    alpha_query_expansion,
    evaluate_rank,
    evaluate_rank_from_features,
    inference_on_dataset,
    k_reciprocal_rerank,
    parse_csv_format,
    print_csv_format,
    result_check_failures,
    verify_results,
)


class LeftRightModel(nn.Module):
    """Features that depend on orientation: mean of the left half and of the right half."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.seen = []

    def forward(self, batch):
        self.seen.append((self.training, torch.is_grad_enabled()))
        x = batch["images"].float()
        w = x.shape[3] // 2
        return torch.stack([x[..., :w].mean((1, 2, 3)), x[..., w:].mean((1, 2, 3))], 1) * self.scale


class Collect(DatasetEvaluator):
    def __init__(self, name="features"):
        self.name = name

    def reset(self):
        self.outputs = []

    def process(self, inputs, outputs):
        self.outputs.append(outputs)

    def evaluate(self):
        return {self.name: float(torch.cat(self.outputs).sum())}


def _batches(n=3, size=2):
    gen = torch.Generator().manual_seed(0)
    return [{"images": torch.randint(0, 256, (size, 3, 4, 6), dtype=torch.uint8, generator=gen),
             "targets": torch.arange(size), "camids": torch.zeros(size, dtype=torch.int64),
             "img_paths": [f"{i}.jpg" for i in range(size)]} for _ in range(n)]


def test_eval_mode_no_grad_and_training_mode_restored():
    model = LeftRightModel().train()
    inference_on_dataset(model, _batches(), Collect())
    assert model.training
    assert all(flags == (False, False) for flags in model.seen)
    model.eval()
    inference_on_dataset(model, _batches(), None)
    assert not model.training


def test_every_run_logs_its_first_progress_line_even_right_after_another(caplog):
    model = LeftRightModel()
    with caplog.at_level(logging.INFO, logger="reid_engine.evaluation.evaluator"):
        inference_on_dataset(model, _batches(n=8), None, progress_label="First run")
        inference_on_dataset(model, _batches(n=8), None, progress_label="Second run")
    text = caplog.text
    assert "First run" in text and "Second run" in text  # not throttled across runs


def test_training_mode_restored_on_error():
    class Failing(LeftRightModel):
        def forward(self, batch):
            raise RuntimeError("boom")

    model = Failing().train()
    with pytest.raises(RuntimeError, match="boom"):
        inference_on_dataset(model, _batches(), Collect())
    assert model.training


def test_flip_test_averages_with_mirror():
    model = LeftRightModel()
    batches = _batches()
    plain, flipped = Collect(), Collect()
    inference_on_dataset(model, batches, plain)
    inference_on_dataset(model, batches, flipped, flip_test=True)
    for b, out_plain, out_flip in zip(batches, plain.outputs, flipped.outputs):
        mirror = model(dict(b, images=b["images"].flip(3)))
        torch.testing.assert_close(out_flip, (out_plain + mirror) / 2)
        assert not torch.allclose(out_flip, out_plain)  # orientation does matter for this model
    assert torch.equal(batches[0]["images"], _batches()[0]["images"])  # inputs untouched


def test_timing_lines_logged(caplog, monkeypatch):
    import reid_engine.evaluation.evaluator as evaluator_module

    monkeypatch.setattr(evaluator_module, "_PROGRESS_PERIOD", 0)  # the throttle is per call site, process-wide
    caplog.set_level(logging.INFO)
    inference_on_dataset(LeftRightModel(), _batches(8), Collect())
    assert "Total inference time" in caplog.text and "pure compute time" in caplog.text
    assert "images/s" in caplog.text and "ETA=" in caplog.text


def test_dataset_evaluators_merge_and_reject_collisions():
    results = inference_on_dataset(LeftRightModel(), _batches(), DatasetEvaluators([Collect("a"), Collect("b")]))
    assert set(results) == {"a", "b"} and results["a"] == results["b"]
    with pytest.raises(KeyError, match="distinct names"):
        inference_on_dataset(LeftRightModel(), _batches(), DatasetEvaluators([Collect(), Collect()]))


def _reid_batches(seed=0, num_query=12, num_gallery=48, dim=8, batch=10):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(6, dim, generator=gen)
    pids = torch.cat([torch.arange(num_query) % 6, torch.randint(0, 6, (num_gallery,), generator=gen)])
    camids = torch.cat([torch.zeros(num_query, dtype=torch.int64), torch.randint(0, 3, (num_gallery,), generator=gen)])
    feats = centers[pids] + 0.9 * torch.randn(len(pids), dim, generator=gen)
    items = [(feats[i:i + batch], {"targets": pids[i:i + batch], "camids": camids[i:i + batch]})
             for i in range(0, len(pids), batch)]
    return feats, pids, camids, items


def _run(cfg, items, num_query, output_dir=None):
    evaluator = ReidEvaluator(cfg, num_query, output_dir)
    evaluator.reset()
    for outputs, inputs in items:
        evaluator.process(inputs, outputs)
    return evaluator.evaluate()


def test_reid_evaluator_results(tmp_path):
    cfg = get_cfg()
    feats, pids, camids, items = _reid_batches()
    results = _run(cfg, items, 12, str(tmp_path))
    assert list(results) == ["Rank-1", "Rank-5", "Rank-10", "mAP", "mINP", "metric"]
    cmc, mean_ap, mean_inp = evaluate_rank_from_features(feats[:12], feats[12:], pids[:12], pids[12:],
                                                         camids[:12], camids[12:])
    assert results["Rank-1"] == pytest.approx(cmc[0] * 100)
    assert results["Rank-10"] == pytest.approx(cmc[9] * 100)
    assert results["mAP"] == pytest.approx(mean_ap * 100)
    assert results["mINP"] == pytest.approx(mean_inp * 100)
    assert results["metric"] == pytest.approx((mean_ap + cmc[0]) * 50)
    assert json.loads((tmp_path / "reid_results.json").read_text())["mAP"] == pytest.approx(results["mAP"])


def test_reid_evaluator_options():
    feats, pids, camids, items = _reid_batches(1)
    qf, gf, qp, gp, qc, gc = feats[:12], feats[12:], pids[:12], pids[12:], camids[:12], camids[12:]
    cfg = get_cfg()
    cfg.TEST.METRIC = "euclidean"
    cfg.TEST.ROC.ENABLED = True
    results = _run(cfg, items, 12)
    assert {"TPR@FPR=1e-04", "TPR@FPR=1e-03", "TPR@FPR=1e-02"} <= set(results)
    assert all(0 <= results[k] <= 100 for k in results)
    assert results["mAP"] == pytest.approx(evaluate_rank_from_features(qf, gf, qp, gp, qc, gc, "euclidean")[1] * 100)

    cfg = get_cfg()
    cfg.TEST.AQE.ENABLED = True
    eq, eg = alpha_query_expansion(qf, gf, 1, cfg.TEST.AQE.QE_K, cfg.TEST.AQE.ALPHA)
    assert _run(cfg, items, 12)["mAP"] == pytest.approx(evaluate_rank_from_features(eq, eg, qp, gp, qc, gc)[1] * 100)

    cfg = get_cfg()
    cfg.TEST.RERANK.ENABLED = True
    cfg.TEST.RERANK.K1, cfg.TEST.RERANK.K2 = 6, 3
    dist = k_reciprocal_rerank(qf, gf, k1=6, k2=3, lambda_value=cfg.TEST.RERANK.LAMBDA)
    assert _run(cfg, items, 12)["mAP"] == pytest.approx(evaluate_rank(dist, qp, gp, qc, gc)[1] * 100)


def test_reid_evaluator_one_camera_is_a_clear_error():
    feats, pids, camids, items = _reid_batches(2)
    items = [(f, dict(t, camids=torch.zeros_like(t["camids"]))) for f, t in items]
    with pytest.raises(ValueError, match="share one camera id"):
        _run(get_cfg(), items, 12)


def test_print_csv_format(caplog):
    caplog.set_level(logging.INFO)
    results = {"Market1501": {"Rank-1": 95.123, "mAP": 87.5}, "DukeMTMC": {"Rank-1": 88.0, "mAP": 77.25}}
    table = print_csv_format(results)
    assert "Market1501" in table and "95.12" in table and "77.25" in table
    assert "copypaste: Dataset,Rank-1,mAP" in caplog.text
    assert "copypaste: DukeMTMC,88.0000,77.2500" in caplog.text
    flat = print_csv_format({"dataset": "VeRi", "Rank-1": 1.5})
    assert "VeRi" in flat and "1.50" in flat


def test_verify_results(caplog):
    cfg = get_cfg()
    results = {"Market1501": {"Rank-1": 95.0, "mAP": 87.0}}
    assert verify_results(cfg, results)  # nothing expected
    cfg.TEST.EXPECTED_RESULTS = [["Market1501", "mAP", 87.2, 0.5]]
    assert verify_results(cfg, results)
    cfg.TEST.EXPECTED_RESULTS = [["Market1501", "mAP", 90.0, 0.5], ["Market1501", "Rank-1", 95.0, 0.1]]
    assert not verify_results(cfg, results)
    assert "Market1501 mAP = 87.0000, expected 90.0000" in caplog.text
    assert result_check_failures(cfg, results) == [
        "Market1501 mAP = 87.0000, expected 90.0000 +- 0.5000 (off by 3.0000)"]
    assert not verify_results(cfg, {"Market1501": {"Rank-1": float("nan"), "mAP": 90.0}})
    cfg.TEST.EXPECTED_RESULTS = [["Market1501", "mINP", 1.0, 0.1]]
    with pytest.raises(ValueError, match="mINP"):
        verify_results(cfg, results)
    cfg.TEST.EXPECTED_RESULTS = [["Market1501", "mAP", 1.0]]
    with pytest.raises(ValueError, match="dataset, metric, value, tolerance"):
        verify_results(cfg, results)


def test_parse_csv_format_reads_back_the_last_printed_results(caplog):
    caplog.set_level(logging.INFO, logger="reid_engine.evaluation.evaluator")
    print_csv_format({"Market1501": {"Rank-1": 90.0, "mAP": 70.0}})
    print_csv_format({"DukeMTMC": {"Rank-1": 88.0, "mAP": 77.25}, "MSMT17": {"Rank-1": 70.5, "mAP": 40.125}})
    assert parse_csv_format(caplog.text) == {"DukeMTMC": {"Rank-1": 88.0, "mAP": 77.25},
                                             "MSMT17": {"Rank-1": 70.5, "mAP": 40.125}}
    assert parse_csv_format("no results here") == {}
