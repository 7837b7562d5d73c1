"""Label-free training (PSEUDO.ENABLED, ClusterContrast) through DefaultTrainer, at tiny size on the CPU:
the pseudo-label loop, its checkpoint state and exact resume across a re-clustering, hidden target
labels, the errors, UDA from a supervised checkpoint and a training-only target set. (A SIGKILL during a
save and the resume after it: tests/e2e/test_train_net.py, for every run; the real-process test of the
label-free loop is the 2-worker one at the end.)"""
import contextlib
import json
import logging
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from reid_engine.clustering import camera_normalized
from reid_engine.config import get_cfg
from reid_engine.data.datasets import get_dataset
from reid_engine.engine import DefaultTrainer
from reid_engine.engine.config_checks import check_config_values
from reid_engine.engine.hooks.pseudo_labels import PseudoLabeler, PseudoLabelError
from reid_engine.utils.env import seed_all_rng
from reid_engine.utils.errors import ReidUserError
from tests.conftest import REPO_ROOT, run_cli

BASE = os.path.join(REPO_ROOT, "configs", "USL", "Base-USL.yml")
TARGET = "SyntheticReIDTiny"
# 4 epochs of 3 iterations, clustering every 2 epochs (iterations 0 and 6), a checkpoint every epoch:
# model_0000002 is in the middle of round 0, model_0000005 just before the re-clustering at 6.
ITERS, PERIOD, EPOCHS = 3, 2, 4


def TINY_OPTS(data_root, out, *extra):  # noqa: N802 (reads as the constant it mostly is)
    """The config overrides of a tiny run (command-line style: key, value, ...)."""
    return [
        "MODEL.DEVICE", "cpu", "MODEL.BACKBONE.DEPTH", "18x", "MODEL.BACKBONE.WIDTH_MULT", 0.25,
        "MODEL.BACKBONE.PRETRAIN", False, "INPUT.SIZE_TRAIN", [64, 32], "INPUT.SIZE_TEST", [64, 32],
        "DATASETS.NAMES", (TARGET,), "DATASETS.TESTS", (), "DATASETS.ROOT", data_root,
        "DATALOADER.NUM_WORKERS", 0, "DATALOADER.NUM_INSTANCE", 4, "SOLVER.IMS_PER_BATCH", 16,
        "SOLVER.MAX_EPOCH", EPOCHS, "SOLVER.STEPS", [3], "SOLVER.CHECKPOINT_PERIOD", 1, "TEST.EVAL_PERIOD", 100,
        "TEST.IMS_PER_BATCH", 64, "PSEUDO.ITERS_PER_EPOCH", ITERS, "PSEUDO.PERIOD", PERIOD, "PSEUDO.K1", 10,
        "PSEUDO.K2", 3, "PSEUDO.EPS", 0.7, "PSEUDO.MIN_SAMPLES", 2, "SEED", 0, "OUTPUT_DIR", str(out),
        "CUDNN_BENCHMARK", False, *extra]


def tiny_cfg(data_root, out, *extra):
    cfg = get_cfg()
    cfg.merge_from_file(BASE)
    cfg.merge_from_list(TINY_OPTS(data_root, out, *extra))
    return cfg


def train(cfg, resume=False):
    check_config_values(cfg)
    seed_all_rng(0)  # as default_setup does with SEED: the same initial weights in every run
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=resume)
    trainer.train()
    return trainer


def final_weights(out):
    return torch.load(os.path.join(out, "model_final.pth"), map_location="cpu", weights_only=True)["model"]


def losses_by_iter(out):
    merged = {}
    with open(os.path.join(out, "metrics.json")) as f:
        for line in f:
            rec = json.loads(line)
            merged.setdefault(rec.pop("iteration"), {}).update(
                {k: v for k, v in rec.items() if k.startswith("loss") or k == "total_loss" or k.startswith("pseudo/")
                 and k != "pseudo/time"})
    return merged


@contextlib.contextmanager
def log_lines():
    """Collect the INFO messages of the package's loggers (DefaultTrainer writes no log file)."""
    lines = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("reid_engine")
    level = log.level  # an earlier in-process benchmark may have raised it (bench_engine_overhead)
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield lines
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


@pytest.fixture(scope="module")
def reference_run(data_root, tmp_path_factory):
    """One uninterrupted tiny label-free run: (output folder, trainer)."""
    out = tmp_path_factory.mktemp("usl") / "ref"
    with log_lines() as lines:
        trainer = train(tiny_cfg(data_root, out))
    trainer.log = "\n".join(lines)
    yield str(out), trainer
    shutil.rmtree(out, ignore_errors=True)


@pytest.mark.slow
def test_pseudo_label_loop_logs_and_checkpoints_its_state(reference_run):
    out, trainer = reference_run
    hook = next(h for h in trainer._hooks if isinstance(h, PseudoLabeler))
    assert hook.round == 1 and hook.cluster_iter == PERIOD * ITERS  # clustered at iterations 0 and 6
    log = trainer.log
    assert "Pseudo labels (round 0, iteration 0)" in log and "Pseudo labels (round 1, iteration 6)" in log
    assert "Pseudo labels: extracting training features" in log and "quality vs ground truth: nmi" in log
    metrics = losses_by_iter(out)
    assert metrics[0]["pseudo/num_clusters"] > 0 and "pseudo/nmi" in metrics[0] and "pseudo/num_clusters" in metrics[6]
    assert "loss_cluster" in json.dumps(metrics) or "total_loss" in metrics[max(metrics)]
    state = torch.load(os.path.join(out, "model_final.pth"), map_location="cpu", weights_only=True)
    saved = state["trainer"]["hooks"]["PseudoLabeler"]
    assert saved["round"] == 1 and saved["cluster_iter"] == 6
    labels = saved["labels"].numpy()
    assert labels.shape == (len(trainer.data_loader.all_items),)
    memory = state["model"]["memory.features"]
    assert memory.shape[0] == int(labels.max()) + 1  # one centroid per cluster of the last round
    # The loader trains on the clustered images only, with the clusters as identities.
    kept = labels[labels >= 0]
    assert sorted({pid for _, pid, _ in trainer.data_loader.dataset.items}) == sorted(set(kept.tolist()))


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["model_0000002.pth", "model_0000005.pth"])
def test_resume_across_a_reclustering_is_exact(reference_run, data_root, tmp_path, checkpoint):
    ref_out, _ = reference_run
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copy(os.path.join(ref_out, checkpoint), out / checkpoint)
    (out / "last_checkpoint").write_text(checkpoint)
    train(tiny_cfg(data_root, out), resume=True)
    assert_same_weights(final_weights(ref_out), final_weights(str(out)))
    ref, got = losses_by_iter(ref_out), losses_by_iter(str(out))
    assert {k: v for k, v in ref.items() if k > int(checkpoint[6:13])} == {k: v for k, v in got.items() if k in ref
                                                                          and k > int(checkpoint[6:13])}


@pytest.mark.slow
def test_target_ground_truth_is_never_read_in_training(reference_run, data_root, tmp_path, monkeypatch):
    """Scramble the target's identities: the trained weights and losses stay the same; only the
    pseudo-label quality (measured against the ground truth after clustering) changes."""
    ref_out, _ = reference_run
    from reid_engine.data import pseudo_labels

    def scrambled(*args, **kwargs):
        ds = get_dataset(*args, **kwargs)
        pids = [pid for _, pid, _ in ds.train]
        perm = np.random.default_rng(1).permutation(len(pids))
        ds.train = [(path, pids[j] * 7 + 3, camid) for (path, _, camid), j in zip(ds.train, perm)]
        return ds

    monkeypatch.setattr(pseudo_labels, "get_dataset", scrambled)
    out = tmp_path / "scrambled"
    train(tiny_cfg(data_root, out))
    assert_same_weights(final_weights(ref_out), final_weights(str(out)))
    ref, got = losses_by_iter(ref_out), losses_by_iter(str(out))
    for it in ref:
        for key in ref[it]:
            if key in ("pseudo/num_clusters", "pseudo/num_outliers") or not key.startswith("pseudo/"):
                assert ref[it][key] == got[it][key], (it, key)
    assert ref[0]["pseudo/nmi"] != got[0]["pseudo/nmi"]


@pytest.mark.slow
def test_too_few_clusters_for_a_batch_are_one_line_suggesting_eps(data_root, tmp_path):
    # (Every target image an outlier: tests/faults/test_group_signals.py, with how the loop logs it.)
    cfg = tiny_cfg(data_root, tmp_path / "out", "SOLVER.MAX_EPOCH", 1, "SOLVER.IMS_PER_BATCH", 128)
    with pytest.raises(PseudoLabelError, match=r"raise PSEUDO.EPS \(now [0-9.]+\)") as info:
        train(cfg)
    assert "clusters were found" in str(info.value)
    assert "\n" not in str(info.value) and isinstance(info.value, ReidUserError)


@pytest.mark.parametrize("key, value, needle", [
    ("PSEUDO.EPS", 1.5, "PSEUDO.EPS"),
    ("PSEUDO.PERIOD", 0, "PSEUDO.PERIOD"),
    ("PSEUDO.K2", 50, "PSEUDO.K2"),
    ("PSEUDO.MEMORY.MOMENTUM", 1.0, "PSEUDO.MEMORY.MOMENTUM"),
    ("PSEUDO.MEMORY.MODE", "median", "PSEUDO.MEMORY.MODE"),
    ("PSEUDO.TARGETS", ("Market1501",), "PSEUDO.TARGETS"),
    ("DATALOADER.SAMPLER_TRAIN", "TrainingSampler", "P x K"),
    ("MODEL.META_ARCHITECTURE", "Baseline", "ClusterContrast"),
    ("PSEUDO.ENABLED", False, "PSEUDO.ENABLED True"),
])
def test_bad_pseudo_values_are_one_line_errors(tmp_path, key, value, needle):
    cfg = tiny_cfg("", tmp_path, key, value)
    with pytest.raises(ReidUserError) as info:
        check_config_values(cfg)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_camera_normalisation_makes_identities_not_cameras_the_nearest_neighbours():
    """PSEUDO.CAMERA_NORM: a strong per-camera offset hides the identities until it is removed."""
    rng = np.random.default_rng(0)
    identity = rng.normal(size=(6, 16))
    camera = rng.normal(size=(2, 16)) * 10
    feats = np.concatenate([identity + camera[0], identity + camera[1]])
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    camids = np.repeat([0, 1], 6)

    def nearest_other_camera_share(x):
        sim = x @ x.T
        np.fill_diagonal(sim, -np.inf)
        return float(np.mean(camids[sim.argmax(1)] != camids))

    assert nearest_other_camera_share(feats) == 0.0
    normed = camera_normalized(feats, camids)
    assert np.allclose(np.linalg.norm(normed, axis=1), 1.0)
    cross = normed[:6] @ normed[6:].T
    assert (cross.argmax(1) == np.arange(6)).all()  # each identity finds itself in the other camera


def test_shipped_label_free_configs_keep_cluster_contrast_settings():
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO_ROOT, "configs", "USL", "cc_R50_MSMT17.yml"))
    assert (cfg.SOLVER.IMS_PER_BATCH, cfg.DATALOADER.NUM_INSTANCE, cfg.SOLVER.MAX_EPOCH) == (256, 16, 50)
    assert cfg.PSEUDO.ITERS_PER_EPOCH == 400 and list(cfg.SOLVER.STEPS) == [20, 40] and cfg.SOLVER.BASE_LR == 3.5e-4
    assert (cfg.PSEUDO.EPS, cfg.PSEUDO.K1, cfg.PSEUDO.K2, cfg.PSEUDO.MEMORY.MOMENTUM) == (0.6, 30, 6, 0.1)
    assert DefaultTrainer.compute_iters_per_epoch(cfg, 32621) == 400


@pytest.mark.slow
def test_uda_starts_from_a_supervised_checkpoint_on_a_training_only_target(data_root, tmp_path):
    """MODEL.WEIGHTS of a supervised Baseline loads into ClusterContrast (its classifier is left out),
    and the target is a training-only set (no query or gallery) without labels (one dummy identity)."""
    from reid_engine.modeling import build_model
    from reid_engine.utils.checkpoint import Checkpointer

    source = tiny_cfg(data_root, tmp_path, "MODEL.META_ARCHITECTURE", "Baseline", "PSEUDO.ENABLED", False,
                      "MODEL.HEADS.NUM_CLASSES", 24)
    model = build_model(source)
    Checkpointer(model, str(tmp_path)).save("source")
    folder = tmp_path / "PKUv1a_128x48"  # PKU: fast-reid's training-only layout, <pid>_<camera>_<n>.png
    folder.mkdir()
    for n, (path, _, camid) in enumerate(get_dataset(TARGET, data_root).train):
        Image.open(path).save(folder / f"0_{camid}_{n}.png")  # one dummy identity: no labels
    cfg = tiny_cfg(str(tmp_path), tmp_path / "out", "DATASETS.NAMES", ("PKU",),
                   "MODEL.WEIGHTS", str(tmp_path / "source.pth"), "SOLVER.MAX_EPOCH", 1)
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=False)
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert torch.equal(start["backbone.conv1.weight"], model.state_dict()["backbone.conv1.weight"])
    with log_lines() as lines:
        trainer.train()
    log = "\n".join(lines)
    assert "Pseudo labels (round 0, iteration 0)" in log and "quality vs ground truth" not in log
    assert not torch.equal(trainer.model.state_dict()["backbone.conv1.weight"], start["backbone.conv1.weight"])


@pytest.mark.slow
def test_joint_training_keeps_the_source_labels_and_clusters_the_target(data_root, tmp_path):
    """Labelled SyntheticReIDTiny + pseudo-labelled SyntheticReIDShiftedTiny in domain-balanced batches:
    the source keeps its 24 identities (0..23), the target's clusters follow them, and the memory
    holds one centroid for each; with camera-aware proxies their two losses train too."""
    cfg = tiny_cfg(data_root, tmp_path, "DATASETS.NAMES", (TARGET, "SyntheticReIDShiftedTiny"),
                   "PSEUDO.TARGETS", ("SyntheticReIDShiftedTiny",), "DATALOADER.SAMPLER_TRAIN", "DomainBalancedSampler",
                   "SOLVER.MAX_EPOCH", 1, "PSEUDO.CAMERA_PROXY.ENABLED", True)
    trainer = train(cfg)
    loader = trainer.data_loader
    for name in ("loss_cluster", "loss_intra_camera", "loss_inter_camera"):  # camera-aware proxies on
        assert np.isfinite(trainer.storage.history(name).latest())
    hook = next(h for h in trainer._hooks if isinstance(h, PseudoLabeler))
    source = np.array([label for _, label, _ in loader.all_items])[~loader.is_target]
    assert loader.num_source_classes == 24 and np.array_equal(hook.labels[~loader.is_target], source)
    assert sorted(set(source.tolist())) == list(range(24))
    target = hook.labels[loader.is_target]
    assert target.max() >= 24 and set(target[target >= 0].tolist()) == set(range(24, int(target.max()) + 1))
    assert trainer.model.memory.features.shape[0] == int(hook.labels.max()) + 1
    assert set(loader.dataset.domains.tolist()) == {0, 1}


@pytest.mark.slow
def test_two_gloo_workers_extract_their_shards_and_share_one_clustering(data_root, tmp_path):
    """The real command with 2 CPU workers: each embeds its shard, the main worker clusters, every
    worker trains on the same clusters (DDP would fail on differently sized memories)."""
    out = tmp_path / "ddp"
    opts = TINY_OPTS(data_root, out, "SOLVER.MAX_EPOCH", 3)
    args = ["--num-gpus", "2", "--dist-url", "auto", "--config-file", BASE] + [str(v) for v in opts]
    proc = run_cli(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (out / "log.txt").read_text()
    assert "Pseudo labels: extracting training features (worker 0 of 2)" in log
    assert "Pseudo labels (round 1, iteration 6)" in log
    state = torch.load(out / "model_final.pth", map_location="cpu", weights_only=True)
    labels = state["trainer"]["hooks"]["PseudoLabeler"]["labels"]
    assert state["model"]["memory.features"].shape[0] == int(labels.max()) + 1

