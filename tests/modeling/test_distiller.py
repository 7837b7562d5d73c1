"""Distiller: the JS-divergence term, frozen teachers, the EMA teacher, checkpoints and errors
(tiny ResNet-18 teacher and student at 64x32, and tiny ViTs with a camera embedding; CPU)."""
import logging
import os

import pytest
import torch

from reid_engine.config import ConfigError, get_cfg
from reid_engine.modeling import build_model
from reid_engine.modeling.heads.build import build_heads
from reid_engine.modeling.losses.build import build_losses
from reid_engine.modeling.meta_arch import Baseline, Distiller
from reid_engine.modeling.meta_arch.distiller import KD_LOSS_NAME, KD_TEMPERATURE, TeacherSet, jsdiv_loss
from reid_engine.utils.checkpoint import Checkpointer
from tests.conftest import REPO_ROOT

from .test_vit import tiny

TINY_CONFIG = os.path.join(REPO_ROOT, "tests", "e2e", "configs", "tiny_R18.yml")
NUM_CLASSES = 6


def _cfg(**kd):
    """The tiny R18 config as a Distiller student with NUM_CLASSES classes and the given KD keys."""
    cfg = get_cfg()
    cfg.merge_from_file(TINY_CONFIG)
    cfg.MODEL.META_ARCHITECTURE = "Distiller"
    cfg.MODEL.HEADS.NUM_CLASSES = NUM_CLASSES
    cfg.KD.MODEL_CONFIG = kd.get("configs", [])
    cfg.KD.MODEL_WEIGHTS = kd.get("weights", [])
    cfg.KD.EMA.ENABLED = kd.get("ema", False)
    cfg.KD.EMA.MOMENTUM = kd.get("momentum", 0.999)
    return cfg


def _save_teacher(folder, num_classes=NUM_CLASSES, seed=1, width=1.0):
    """A tiny R18 teacher config (its NUM_CLASSES left 0, a training config; `width`: its
    MODEL.BACKBONE.WIDTH_MULT) and random weights."""
    config = folder / "teacher.yml"
    config.write_text(f"_BASE_: {TINY_CONFIG}\nMODEL:\n  BACKBONE:\n    WIDTH_MULT: {width}\n")
    cfg = get_cfg()
    cfg.merge_from_file(str(config))
    cfg.MODEL.HEADS.NUM_CLASSES = num_classes
    torch.manual_seed(seed)
    teacher = Baseline.from_config(cfg)
    for module in teacher.modules():  # non-trivial BN statistics: eval mode must use them
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    weights = folder / f"teacher_{num_classes}.pth"
    torch.save({"model": teacher.state_dict()}, weights)
    return str(config), str(weights), teacher


def _batch(seed=0, size=8):
    g = torch.Generator().manual_seed(seed)
    return {"images": torch.randint(0, 256, (size, 3, 64, 32), generator=g).float(),
            "targets": torch.arange(size) % NUM_CLASSES}


@pytest.fixture(scope="module")
def teacher_files(tmp_path_factory):
    """One tiny R18 teacher (config, weights, model) for the module: the tests only read it."""
    return _save_teacher(tmp_path_factory.mktemp("teacher"))


def test_jsdiv_loss_equals_the_hand_computed_value():
    student = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]], dtype=torch.float64)
    teacher = torch.tensor([[1.0, 0.0, -1.0], [-1.0, 2.5, 0.5]], dtype=torch.float64)
    t = 16.0
    p_s, p_t = torch.softmax(student / t, 1), torch.softmax(teacher / t, 1)
    kl_ts = (p_t * (p_t.log() - p_s.log())).sum()
    kl_st = (p_s * (p_s.log() - p_t.log())).sum()
    expected = (kl_ts + kl_st) / 2 * t * t / 2  # batch of 2
    assert KD_TEMPERATURE == 16
    assert jsdiv_loss(student, teacher).item() == pytest.approx(expected.item(), rel=1e-5)
    assert jsdiv_loss(student, student).item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.slow
def test_distiller_loss_is_the_mean_js_divergence_to_eval_mode_teachers(teacher_files):
    config, weights, saved_teacher = teacher_files
    torch.manual_seed(0)
    model = build_model(_cfg(configs=[config, config], weights=[weights, weights]))
    assert isinstance(model, Distiller) and len(model.teacher_set.models) == 2
    batch = _batch()
    losses = model(batch)
    assert set(losses) >= {"loss_cls", KD_LOSS_NAME}
    # Recompute by hand: the student's training logits, the teacher's eval-mode logits.
    images = model.preprocess_image(batch)
    student_logits = model.heads(model.backbone(images), batch["targets"])["pred_class_logits"]
    saved_teacher.eval()
    with torch.no_grad():
        teacher_logits = saved_teacher.heads.class_logits(saved_teacher.backbone(images))
    expected = jsdiv_loss(student_logits, teacher_logits)  # two equal teachers: their mean
    assert losses[KD_LOSS_NAME].item() == pytest.approx(expected.item(), rel=1e-5)
    assert losses[KD_LOSS_NAME].item() > 0


def test_vit_student_and_teacher_with_sie_get_the_batch_camids():
    """With a camera embedding, student and teacher see the batch's "camids" (through
    run_backbone), so the distillation term depends on them."""
    cfg = get_cfg()
    cfg.MODEL.HEADS.NUM_CLASSES = NUM_CLASSES
    cfg.MODEL.HEADS.POOL_LAYER = "Identity"

    def vit_baseline(seed, **kwargs):
        parts = dict(backbone=tiny(num_cameras=3, sie_coe=3.0), heads=build_heads(cfg, 64))
        torch.manual_seed(seed)
        with torch.no_grad():  # far from the near-zero initial classifier and camera embedding
            for part in parts.values():
                for parameter in part.parameters():
                    parameter.normal_(0, 0.3)
        return dict(pixel_mean=list(cfg.MODEL.PIXEL_MEAN), pixel_std=list(cfg.MODEL.PIXEL_STD), **parts, **kwargs)

    teacher = Baseline(**vit_baseline(1)).eval()
    model = Distiller(teachers=TeacherSet([teacher]), **vit_baseline(2, loss_fn=build_losses(cfg))).train()
    batch = {**_batch(size=4), "camids": torch.tensor([0, 1, 2, 0])}
    losses = model(batch)
    images = model.preprocess_image(batch)
    with torch.no_grad():
        taught = teacher.heads.class_logits(teacher.backbone(images, camids=batch["camids"]))
    student = model.heads(model.backbone(images, camids=batch["camids"]), batch["targets"])["pred_class_logits"]
    assert losses[KD_LOSS_NAME].item() == pytest.approx(jsdiv_loss(student, taught).item(), rel=1e-5)
    other_cameras = model({**batch, "camids": torch.tensor([2, 2, 1, 1])})
    assert abs(other_cameras[KD_LOSS_NAME].item() - losses[KD_LOSS_NAME].item()) > 1e-6


@pytest.mark.slow
def test_teachers_are_frozen_in_eval_mode_and_outside_the_state_dict(teacher_files):
    config, weights, _ = teacher_files
    model = build_model(_cfg(configs=[config], weights=[weights], ema=True))
    teachers = model.teacher_set
    before = {k: v.clone() for k, v in teachers.state_dict().items() if isinstance(v, torch.Tensor)}
    model.train()
    assert all(not m.training for m in teachers.modules())
    assert all(not p.requires_grad for p in teachers.parameters())
    assert not any(k.startswith("teacher") for k in model.state_dict())
    assert {id(p) for p in model.parameters()}.isdisjoint(id(p) for p in teachers.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sum(model(_batch()).values()).backward()
    optimizer.step()
    assert all(p.grad is None for p in teachers.parameters())
    fixed = teachers.models[1].state_dict()  # models[0] is the EMA teacher
    assert all(torch.equal(before[f"models.1.{k}"], v) for k, v in fixed.items())
    model.eval()
    assert model(_batch()["images"]).shape == (8, 512)
    model.to(torch.float64)  # the unregistered teachers follow the student
    assert all(p.dtype == torch.float64 for p in teachers.parameters())


@pytest.mark.slow
def test_ema_teacher_starts_as_the_student_and_follows_the_formula():
    momentum = 0.9
    torch.manual_seed(0)
    model = build_model(_cfg(ema=True, momentum=momentum))
    assert model.has_ema_teacher and not model.teacher_set.ema_initialized
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    sum(model(_batch()).values()).backward()  # the first step copies the student, then runs it
    ema = model.teacher_set.models[0]
    assert all(torch.equal(ema.state_dict()[k], v) for k, v in initial.items())
    old_teacher = {k: v.clone() for k, v in ema.state_dict().items()}
    optimizer.step()
    model.update_ema_teacher()
    student = model.state_dict()
    moved = 0
    for name, value in ema.state_dict().items():
        if value.is_floating_point():
            expected = momentum * old_teacher[name] + (1 - momentum) * student[name]
            torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-7)
            moved += not torch.equal(old_teacher[name], student[name])
        else:
            assert torch.equal(value, student[name])
    assert moved > 10  # parameters and BN statistics changed


@pytest.mark.slow
def test_student_checkpoint_loads_into_a_plain_baseline(tmp_path, teacher_files, caplog):
    config, weights, _ = teacher_files
    cfg = _cfg(configs=[config], weights=[weights], ema=True)
    model = build_model(cfg)
    model(_batch())
    Checkpointer(model, str(tmp_path / "out"), teachers=model.teacher_state).save("model_final")
    saved = torch.load(tmp_path / "out" / "model_final.pth", weights_only=True)
    assert set(saved) == {"model", "teachers", "checksum"}
    assert set(saved["model"]) == set(model.state_dict())
    cfg.MODEL.META_ARCHITECTURE = "Baseline"
    plain = build_model(cfg)
    with caplog.at_level(logging.INFO, logger="reid_engine.utils.checkpoint"):
        Checkpointer(plain).load(str(tmp_path / "out" / "model_final.pth"))
    n = len(plain.state_dict())
    assert f"Loaded {n} of {n} model tensors" in caplog.text and "not used by the model" not in caplog.text
    model.eval()
    plain.eval()
    images = _batch()["images"]
    assert torch.equal(model(images), plain(images))


def _error(cfg):
    with pytest.raises(ConfigError) as info:
        build_model(cfg)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.slow
def test_errors_name_the_key_and_the_fix(tmp_path, teacher_files):
    config, weights, _ = teacher_files
    missing = str(tmp_path / "nowhere.yml")
    assert "KD.MODEL_CONFIG[0]" in _error(_cfg(configs=[missing], weights=[weights])) and "does not exist" in \
        _error(_cfg(configs=[missing], weights=[weights]))
    bad = tmp_path / "bad.yml"
    bad.write_text("MODEL:\n  BACKBONE:\n    DEPTHH: 18x\n")
    message = _error(_cfg(configs=[str(bad)], weights=[weights]))
    assert "KD.MODEL_CONFIG[0]" in message and "MODEL.BACKBONE.DEPTH" in message
    message = _error(_cfg(configs=[config], weights=[str(tmp_path / "none.pth")]))
    assert "KD.MODEL_WEIGHTS[0]" in message and "does not exist" in message
    _, other_weights, _ = _save_teacher(tmp_path, num_classes=NUM_CLASSES + 1)
    message = _error(_cfg(configs=[config], weights=[other_weights]))
    assert f"{NUM_CLASSES + 1} classes" in message and "MODEL.HEADS.NUM_CLASSES" in message
    wide = tmp_path / "wide.yml"
    wide.write_text(f"_BASE_: {config}\nMODEL:\n  HEADS:\n    NUM_CLASSES: 751\n")
    assert "751 classes" in _error(_cfg(configs=[str(wide)], weights=[weights]))
    assert "KD.MODEL_WEIGHTS has 0" in _error(_cfg(configs=[config]))
    assert "KD.EMA.ENABLED" in _error(_cfg())
    assert "KD.EMA.MOMENTUM" in _error(_cfg(ema=True, momentum=1.0))


def test_check_config_reads_teacher_configs_but_no_weights(tmp_path, teacher_files):
    config, _, _ = teacher_files
    Distiller.check_config(_cfg(configs=[config], weights=[str(tmp_path / "later.pth")]))
    with pytest.raises(ConfigError, match=r"KD.MODEL_CONFIG\[0\]"):
        Distiller.check_config(_cfg(configs=[str(tmp_path / "nowhere.yml")], weights=["x.pth"]))


def _train(cfg, resume):
    from reid_engine.engine.defaults import DefaultTrainer

    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=resume)
    trainer.train()
    return trainer


@pytest.mark.slow
def test_resume_through_the_trainer_is_exact(tmp_path, data_root):
    logging.getLogger("reid_engine").setLevel(logging.INFO)  # else DefaultTrainer sets up logging
    # quarter-width student and teacher: what resumes is the same, at a quarter of the cost
    config, weights, _ = _save_teacher(tmp_path, num_classes=24, width=0.25)  # SyntheticReIDTiny's training ids
    cfg = _cfg(configs=[config], weights=[weights], ema=True, momentum=0.5)
    cfg.merge_from_list(["MODEL.HEADS.NUM_CLASSES", 0, "DATASETS.ROOT", data_root, "SOLVER.IMS_PER_BATCH", 64,
                         "MODEL.BACKBONE.WIDTH_MULT", 0.25,
                         "SOLVER.MAX_EPOCH", 2, "SOLVER.WARMUP_ITERS", 1, "SOLVER.STEPS", "[1]",
                         "INPUT.SIZE_TRAIN", "[32, 16]", "INPUT.SIZE_TEST", "[32, 16]",
                         "TEST.EVAL_PERIOD", 100, "DATASETS.TESTS", "()", "OUTPUT_DIR", str(tmp_path / "out")])
    straight = _train(cfg, resume=False)
    assert straight.max_iter >= 2 and straight.max_iter % 2 == 0
    assert any(type(h).__name__ == "EMATeacher" for h in straight._hooks)
    assert KD_LOSS_NAME in straight.storage.histories()
    final_student = {k: v.clone() for k, v in straight.model.state_dict().items()}
    final_teachers = {k: v.clone() for k, v in straight.model.teacher_set.state_dict().items()
                      if isinstance(v, torch.Tensor)}
    # Resume from the checkpoint written after the first epoch.
    half = straight.max_iter // 2
    (tmp_path / "out" / "last_checkpoint").write_text(f"model_{half - 1:07d}.pth")
    torch.rand(3)
    resumed = _train(cfg, resume=True)
    assert resumed.start_iter == half
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, final_student[name]), name
    for name, value in resumed.model.teacher_set.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, final_teachers[name]), name
    assert resumed.model.teacher_set.ema_initialized
