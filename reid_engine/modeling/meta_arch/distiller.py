"""Distiller: a Baseline student trained with the logits of frozen teachers (fast-reid's FastDistill).

Teachers come from two sources, averaged in the loss:
- fixed teachers: Baselines built from KD.MODEL_CONFIG (each file merged onto a fresh default
  config, as fast-reid does) and loaded from KD.MODEL_WEIGHTS;
- with KD.EMA.ENABLED, a self-distillation teacher (listed first): an exponential moving
  average of the student, updated after each optimizer step (`update_ema_teacher`).

Teachers are kept out of the model's state_dict (as in fast-reid), so a Distiller's
``model_final.pth`` is a plain Baseline checkpoint of the student; the trainer checkpoints
them separately through `teacher_state` (weights, EMA state), so --resume is exact.
"""
import copy
import logging
import os
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from reid_engine.config import ConfigError, get_cfg
from reid_engine.utils.checkpoint import Checkpointer

from .base import check_parts_config
from .baseline import Baseline
from .build import META_ARCH_REGISTRY

__all__ = ["Distiller", "TeacherSet", "jsdiv_loss", "build_teachers", "KD_TEMPERATURE", "KD_LOSS_NAME"]

logger = logging.getLogger(__name__)

#: softmax temperature of the distillation loss (fast-reid's fixed value)
KD_TEMPERATURE = 16.0
#: name of the distillation term in the loss dict (fast-reid's)
KD_LOSS_NAME = "loss_jsdiv"


def jsdiv_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
               temperature: float = KD_TEMPERATURE) -> torch.Tensor:
    """fast-reid's "JS divergence": the mean of KL(t || s) and KL(s || t) between the
    temperature-softened class distributions, summed over classes, averaged over the batch
    and multiplied by T^2 (so the gradient scale does not shrink with T).

    Gradients flow into both arguments (fast-reid detaches the teacher logits before).

    Args:
        student_logits, teacher_logits: (B, C) logits.
        temperature: softmax temperature T.
    Returns:
        the scalar loss.
    """
    log_s = F.log_softmax(student_logits.float() / temperature, dim=1)
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=1)
    # kl_div(input, target) = sum target * (log target - input) = KL(target || input)
    kl_t_s = F.kl_div(log_s, log_t, reduction="sum", log_target=True)
    kl_s_t = F.kl_div(log_t, log_s, reduction="sum", log_target=True)
    return (kl_t_s + kl_s_t) / 2 * temperature ** 2 / student_logits.shape[0]


class _StrictCheckpointer(Checkpointer):
    """The project's safe Checkpointer that keeps the load's incompatible keys for checking."""

    def _log_incompatible_keys(self, incompatible) -> None:
        self.incompatible = incompatible
        super()._log_incompatible_keys(incompatible)


def _teacher_config(path: str, index: int):
    """The config of fixed teacher `index`: `path` merged onto the defaults, as a Baseline."""
    key = f"KD.MODEL_CONFIG[{index}]"
    if not os.path.isfile(path):
        raise ConfigError(f"teacher config file {path!r} ({key}) does not exist; set {key} to the teacher's "
                          "training config (e.g. <its OUTPUT_DIR>/config.yaml)")
    cfg = get_cfg()
    try:
        cfg.merge_from_file(path)
    except ConfigError as e:
        raise ConfigError(f"teacher config {key}: {e}") from None
    cfg.MODEL.META_ARCHITECTURE = "Baseline"
    # The teacher runs inside this process without a DDP wrapper; its weights come from
    # KD.MODEL_WEIGHTS, so ImageNet weights are not loaded first.
    for node in (cfg.MODEL.BACKBONE, cfg.MODEL.HEADS):
        if node.NORM == "syncBN":
            node.NORM = "BN"
    cfg.MODEL.BACKBONE.PRETRAIN = False
    return cfg


def _check_num_classes(teacher_classes: int, student_classes: int, where: str) -> None:
    if teacher_classes != student_classes:
        raise ConfigError(f"the teacher {where} has {teacher_classes} classes but the student has {student_classes} "
                          "(MODEL.HEADS.NUM_CLASSES); distill on the teacher's training set or use a teacher "
                          "trained on this one")


def _freeze(model: nn.Module) -> nn.Module:
    for param in model.parameters():
        param.requires_grad_(False)
    return model.eval()


def _load_teacher(model: nn.Module, path: str, index: int, num_classes: int) -> None:
    """Load KD.MODEL_WEIGHTS[index] into `model`; every tensor must fit."""
    key = f"KD.MODEL_WEIGHTS[{index}]"
    if not os.path.isfile(path):
        raise ConfigError(f"teacher weights file {path!r} ({key}) does not exist; set {key} to the teacher's "
                          "checkpoint (e.g. <its OUTPUT_DIR>/model_final.pth)")
    checkpointer = _StrictCheckpointer(model, save_to_disk=False)
    logger.info("Loading teacher %d weights from %s", index, path)
    checkpointer.load(path, checkpointables=[])
    incompatible = checkpointer.incompatible
    for name, checkpoint_shape, _ in incompatible.incorrect_shapes:
        if name == "heads.weight":
            _check_num_classes(checkpoint_shape[0], num_classes, f"weights {path} ({key})")
    if incompatible.incorrect_shapes or incompatible.missing_keys:
        names = [k for k, _, _ in incompatible.incorrect_shapes] + list(incompatible.missing_keys)
        raise ConfigError(f"teacher weights {path} ({key}) do not fit the teacher built from "
                          f"KD.MODEL_CONFIG[{index}] ({len(names)} tensors missing or of another shape, e.g. "
                          f"{names[0]}); pair each weights file with the config it was trained with")


def build_teachers(cfg) -> List[Baseline]:
    """The fixed teachers of KD.MODEL_CONFIG / KD.MODEL_WEIGHTS, frozen and in eval mode.

    A teacher config with MODEL.HEADS.NUM_CLASSES 0 (a training config) gets the student's.

    Raises:
        ConfigError: a missing or invalid config file, a missing weights file, weights
            that do not fit, or a classifier width other than the student's.
    """
    student_classes = cfg.MODEL.HEADS.NUM_CLASSES
    teachers = []
    for index, (config_path, weights_path) in enumerate(zip(cfg.KD.MODEL_CONFIG, cfg.KD.MODEL_WEIGHTS)):
        cfg_t = _teacher_config(config_path, index)
        if cfg_t.MODEL.HEADS.NUM_CLASSES == 0:
            cfg_t.MODEL.HEADS.NUM_CLASSES = student_classes
        _check_num_classes(cfg_t.MODEL.HEADS.NUM_CLASSES, student_classes,
                           f"config {config_path} (KD.MODEL_CONFIG[{index}])")
        if (list(cfg_t.MODEL.PIXEL_MEAN), list(cfg_t.MODEL.PIXEL_STD)) != (list(cfg.MODEL.PIXEL_MEAN),
                                                                           list(cfg.MODEL.PIXEL_STD)):
            # fast-reid feeds the teachers the student's normalised images too.
            logger.warning("teacher %d (%s) was trained with other MODEL.PIXEL_MEAN / PIXEL_STD; it sees "
                           "images normalised with the student's", index, config_path)
        teacher = Baseline.from_config(cfg_t)
        _load_teacher(teacher, weights_path, index, student_classes)
        teachers.append(_freeze(teacher))
    return teachers


def _check_kd_config(cfg) -> None:
    kd = cfg.KD
    if len(kd.MODEL_CONFIG) != len(kd.MODEL_WEIGHTS):
        raise ConfigError(f"KD.MODEL_CONFIG has {len(kd.MODEL_CONFIG)} files but KD.MODEL_WEIGHTS has "
                          f"{len(kd.MODEL_WEIGHTS)}; give one weights file per teacher config")
    if not kd.MODEL_CONFIG and not kd.EMA.ENABLED:
        raise ConfigError("MODEL.META_ARCHITECTURE Distiller has no teacher; set KD.MODEL_CONFIG and "
                          "KD.MODEL_WEIGHTS, or KD.EMA.ENABLED True for self-distillation")
    if kd.EMA.ENABLED and not 0.0 <= kd.EMA.MOMENTUM < 1.0:
        raise ConfigError(f"KD.EMA.MOMENTUM must be in [0, 1), got {kd.EMA.MOMENTUM} (e.g. 0.999)")


class TeacherSet(nn.Module):
    """The teachers of a Distiller, always frozen and in eval mode, and the EMA state.

    Its state_dict (a checkpointable of the trainer) holds every teacher's weights and
    whether the EMA teacher was initialised: it teacher copies the student at the first training step
    (after MODEL.WEIGHTS is loaded), then follows it.

    Args:
        teachers: the fixed teachers.
        ema_teacher: a copy of the student to be averaged, or None.
        ema_momentum: m in  teacher = m * teacher + (1 - m) * student.
    """

    def __init__(self, teachers: Sequence[nn.Module], ema_teacher: Optional[nn.Module] = None,
                 ema_momentum: float = 0.999):
        super().__init__()
        members = ([ema_teacher] if ema_teacher is not None else []) + list(teachers)
        self.models = nn.ModuleList([_freeze(t) for t in members])
        self.has_ema = ema_teacher is not None
        self.ema_momentum = float(ema_momentum)
        # A Python flag (checked every step without a device sync), checkpointed as extra state.
        self.ema_initialized = False
        self.eval()

    def get_extra_state(self) -> dict:
        """Checkpointed with the weights: whether the EMA teacher has started following the student."""
        return {"ema_initialized": self.ema_initialized}

    def set_extra_state(self, state: dict) -> None:
        self.ema_initialized = bool(state["ema_initialized"])

    def train(self, mode: bool = True) -> "TeacherSet":
        """Teachers stay in eval mode whatever the student does."""
        return super().train(False)

    @torch.no_grad()
    def update_ema(self, student: nn.Module) -> None:
        """Move the EMA teacher towards `student` (or copy it, the first time).

        Floating-point parameters and buffers (BN statistics: the teacher runs in eval
        mode) are averaged; integer buffers (BN's num_batches_tracked) are copied.
        """
        if not self.has_ema:
            return
        source = student.state_dict()
        momentum = self.ema_momentum if self.ema_initialized else 0.0
        for name, value in self.models[0].state_dict().items():
            if value.is_floating_point():
                value.mul_(momentum).add_(source[name].detach().to(value.dtype), alpha=1.0 - momentum)
            else:
                value.copy_(source[name])
        self.ema_initialized = True

    def logits(self, run_backbone: Callable[[nn.Module], torch.Tensor]) -> List[torch.Tensor]:
        """Each teacher's class logits (no gradients); `run_backbone(backbone)` gives a backbone's
        features of the batch (the student's normalised images, plus camera ids where taken)."""
        with torch.no_grad():
            return [model.heads.class_logits(run_backbone(model.backbone)) for model in self.models]


@META_ARCH_REGISTRY.register()
class Distiller(Baseline):
    """A Baseline student whose training loss adds `jsdiv_loss` (T = 16) between its logits and
    each teacher's, averaged over teachers, as ``loss_jsdiv``. Eval mode: the student's features.

    The teachers are not registered sub-modules (not in state_dict, not trained, not in the
    optimizer); `.to()` / `.cuda()` / `.half()` move them with the student.

    Args:
        teachers: a TeacherSet.
        kwargs: the student's Baseline arguments.
    """

    def __init__(self, *, teachers: TeacherSet, **kwargs):
        super().__init__(**kwargs)
        self.__dict__["teacher_set"] = teachers  # a plain attribute: outside state_dict and parameters()

    @staticmethod
    def check_config(cfg) -> None:
        """Check the KD keys, the student's parts and each teacher config file's (no weights are read)."""
        _check_kd_config(cfg)
        check_parts_config(cfg)
        for index, path in enumerate(cfg.KD.MODEL_CONFIG):
            check_parts_config(_teacher_config(path, index))

    @classmethod
    def from_config(cls, cfg) -> "Distiller":
        """Build the student like Baseline, the teachers from KD.*; see `build_teachers`."""
        _check_kd_config(cfg)
        student = Baseline.from_config(cfg)
        ema_teacher = copy.deepcopy(student) if cfg.KD.EMA.ENABLED else None
        teachers = TeacherSet(build_teachers(cfg), ema_teacher, cfg.KD.EMA.MOMENTUM)
        for model in teachers.models:
            if not hasattr(model.heads, "class_logits"):
                raise ConfigError(f"MODEL.HEADS.NAME {type(model.heads).__name__} of a teacher cannot give class "
                                  "logits in eval mode; use EmbeddingHead")
        return cls(teachers=teachers, backbone=student.backbone, heads=student.heads,
                   pixel_mean=list(cfg.MODEL.PIXEL_MEAN), pixel_std=list(cfg.MODEL.PIXEL_STD),
                   loss_fn=student.loss_fn)

    @property
    def teacher_state(self) -> TeacherSet:
        """The teachers as a checkpointable (state_dict / load_state_dict) for the trainer."""
        return self.teacher_set

    @property
    def has_ema_teacher(self) -> bool:
        """Whether `update_ema_teacher` must be called after each optimizer step."""
        return self.teacher_set.has_ema

    def update_ema_teacher(self) -> None:
        """Average the student into the EMA teacher; call after each optimizer step."""
        # The student's state_dict has the Baseline keys of the EMA teacher (teachers are not in it).
        self.teacher_set.update_ema(self)

    def __call__(self, *args, **kwargs):
        # The first training call: the EMA teacher starts as the student (after MODEL.WEIGHTS is
        # loaded). Done here, before the (in place) compiled forward: a Python flag read inside
        # forward is a torch.compile guard that recompiles once when it flips.
        if self.training and self.teacher_set.has_ema and not self.teacher_set.ema_initialized:
            self.update_ema_teacher()
        return super().__call__(*args, **kwargs)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .cuda() / .half() / channels_last reach the unregistered teachers too.
        super()._apply(fn, *args, **kwargs)
        self.teacher_set._apply(fn, *args, **kwargs)
        return self

    def forward(self, batch: Union[Mapping[str, torch.Tensor], torch.Tensor]
                ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """Training: the student's losses plus ``loss_jsdiv``; eval: the student's features (B, D)."""
        if not self.training:
            return super().forward(batch)
        # One normalisation for student and teachers, as in fast-reid (the teachers' own
        # PIXEL_MEAN / PIXEL_STD are not applied).
        images = self.preprocess_image(batch)
        targets = self.training_targets(batch, self.loss_fn)
        outputs = self.heads(self.run_backbone(self.backbone, batch, images), targets)
        losses = self.loss_fn(outputs, targets)
        teacher_logits = self.teacher_set.logits(lambda backbone: self.run_backbone(backbone, batch, images))
        student_logits = outputs["pred_class_logits"]
        losses[KD_LOSS_NAME] = sum(jsdiv_loss(student_logits, t) for t in teacher_logits) / len(teacher_logits)
        return losses

