"""The loss registry and ``build_losses``: the only reader of ``MODEL.LOSSES.*``.

Each registered class is named as in ``MODEL.LOSSES.NAME``, reads its own section of
``MODEL.LOSSES`` in ``from_config(cfg)`` (build contract: utils.registry), and when called with the head outputs returns one
named, scaled loss term.
"""
import logging
from typing import Dict, Sequence

import torch

from reid_engine.config import ConfigError
from reid_engine.utils.registry import Registry

from .circle import pairwise_circle_loss
from .cosface import pairwise_cosface_loss
from .cross_entropy import cross_entropy_loss
from .focal import focal_loss
from .triplet import triplet_loss

__all__ = ["LOSS_REGISTRY", "ReidLoss", "LossSet", "build_losses", "check_loss_names",
           "registered_loss_names"]

logger = logging.getLogger(__name__)

LOSS_REGISTRY = Registry("LOSS", key="MODEL.LOSSES.NAME")
LOSS_REGISTRY.__doc__ = """
Loss terms by ``MODEL.LOSSES.NAME`` entry (build contract: utils.registry).
``cls.from_config(cfg)`` returns a callable ``(outputs: dict, targets) -> {output_key: loss * SCALE}``.
"""


class ReidLoss:
    """Base of the registered losses: one scaled term computed from one head output.

    Subclasses set ``output_key`` (name of the returned loss), ``input_key`` (the head
    output they read: "cls_outputs" or "features") and implement ``compute``.

    Args:
        scale: factor applied to the loss value.
    """

    output_key = ""
    input_key = ""

    def __init__(self, scale: float):
        self.scale = float(scale)

    @classmethod
    def from_config(cls, cfg) -> "ReidLoss":
        """Build from the config, reading only this loss's own section of MODEL.LOSSES."""
        raise NotImplementedError

    def compute(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Unscaled loss value (scalar tensor) from the head output ``inputs``."""
        raise NotImplementedError

    def __call__(self, outputs: Dict[str, torch.Tensor], targets: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Return ``{output_key: compute(outputs[input_key], targets) * scale}``."""
        if self.input_key not in outputs:
            raise ValueError(f"{type(self).__name__} needs the head output {self.input_key!r}, but the "
                             f"head returned {sorted(outputs)}; use a head that provides it")
        return {self.output_key: self.compute(outputs[self.input_key], targets) * self.scale}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@LOSS_REGISTRY.register()
class CrossEntropyLoss(ReidLoss):
    """Label-smoothed cross entropy on the classifier logits (``loss_cls``).

    Args:
        eps: smoothing in [0, 1), or -1 for adaptive smoothing.
        alpha: factor of the adaptive smoothing.
        scale: loss weight.
    """

    output_key = "loss_cls"
    input_key = "cls_outputs"

    def __init__(self, eps: float, alpha: float, scale: float):
        super().__init__(scale)
        self.eps = float(eps)
        self.alpha = float(alpha)

    @classmethod
    def from_config(cls, cfg) -> "CrossEntropyLoss":
        """Read MODEL.LOSSES.CE (EPSILON, ALPHA, SCALE)."""
        ce = cfg.MODEL.LOSSES.CE
        _check(ce.EPSILON == -1 or 0 <= ce.EPSILON < 1,
               f"MODEL.LOSSES.CE.EPSILON must be in [0, 1) or -1 (adaptive), got {ce.EPSILON}")
        _check(ce.EPSILON != -1 or 0 <= ce.ALPHA <= 1,
               f"MODEL.LOSSES.CE.ALPHA must be in [0, 1] for adaptive smoothing, got {ce.ALPHA}")
        return cls(ce.EPSILON, ce.ALPHA, ce.SCALE)

    def compute(self, inputs, targets):
        """Cross entropy of (B, C) logits."""
        return cross_entropy_loss(inputs, targets, self.eps, self.alpha)


@LOSS_REGISTRY.register()
class FocalLoss(ReidLoss):
    """Focal loss on the classifier logits (``loss_focal``).

    Args:
        alpha: weight of each term.
        gamma: focusing exponent (>= 0).
        scale: loss weight.
    """

    output_key = "loss_focal"
    input_key = "cls_outputs"

    def __init__(self, alpha: float, gamma: float, scale: float):
        super().__init__(scale)
        self.alpha = float(alpha)
        self.gamma = float(gamma)

    @classmethod
    def from_config(cls, cfg) -> "FocalLoss":
        """Read MODEL.LOSSES.FL (ALPHA, GAMMA, SCALE)."""
        fl = cfg.MODEL.LOSSES.FL
        _check(fl.GAMMA >= 0, f"MODEL.LOSSES.FL.GAMMA must be >= 0, got {fl.GAMMA}")
        return cls(fl.ALPHA, fl.GAMMA, fl.SCALE)

    def compute(self, inputs, targets):
        """Mean focal loss of (B, C) logits."""
        return focal_loss(inputs, targets, self.alpha, self.gamma)


@LOSS_REGISTRY.register()
class TripletLoss(ReidLoss):
    """Batch triplet loss on the metric features (``loss_triplet``).

    Args:
        margin: >= 0; 0 selects the soft margin.
        norm_feat: L2-normalise features first.
        hard_mining: hardest positive / negative; otherwise softmax-weighted mining.
        scale: loss weight.
    """

    output_key = "loss_triplet"
    input_key = "features"

    def __init__(self, margin: float, norm_feat: bool, hard_mining: bool, scale: float):
        super().__init__(scale)
        self.margin = float(margin)
        self.norm_feat = bool(norm_feat)
        self.hard_mining = bool(hard_mining)

    @classmethod
    def from_config(cls, cfg) -> "TripletLoss":
        """Read MODEL.LOSSES.TRI (MARGIN, NORM_FEAT, HARD_MINING, SCALE)."""
        tri = cfg.MODEL.LOSSES.TRI
        _check(tri.MARGIN >= 0,
               f"MODEL.LOSSES.TRI.MARGIN must be >= 0 (0 = soft margin), got {tri.MARGIN}")
        return cls(tri.MARGIN, tri.NORM_FEAT, tri.HARD_MINING, tri.SCALE)

    def compute(self, inputs, targets):
        """Triplet loss of (B, D) features."""
        return triplet_loss(inputs, targets, self.margin, self.norm_feat, self.hard_mining)


class _PairwiseLoss(ReidLoss):
    """Shared construction of the pair-based losses with a margin and a scale gamma."""

    input_key = "features"
    section = ""

    def __init__(self, margin: float, gamma: float, scale: float):
        super().__init__(scale)
        self.margin = float(margin)
        self.gamma = float(gamma)

    @classmethod
    def from_config(cls, cfg) -> "_PairwiseLoss":
        """Read MODEL.LOSSES.<section> (MARGIN, GAMMA, SCALE)."""
        section = cfg.MODEL.LOSSES[cls.section]
        _check(section.GAMMA > 0,
               f"MODEL.LOSSES.{cls.section}.GAMMA must be > 0, got {section.GAMMA}")
        return cls(section.MARGIN, section.GAMMA, section.SCALE)


@LOSS_REGISTRY.register()
class CircleLoss(_PairwiseLoss):
    """Pairwise circle loss on the metric features (``loss_circle``)."""

    output_key = "loss_circle"
    section = "CIRCLE"

    def compute(self, inputs, targets):
        """Circle loss of (B, D) features."""
        return pairwise_circle_loss(inputs, targets, self.margin, self.gamma)


@LOSS_REGISTRY.register()
class Cosface(_PairwiseLoss):
    """Pairwise CosFace on the metric features (``loss_cosface``)."""

    output_key = "loss_cosface"
    section = "COSFACE"

    def compute(self, inputs, targets):
        """CosFace loss of (B, D) features."""
        return pairwise_cosface_loss(inputs, targets, self.margin, self.gamma)


class LossSet:
    """The configured losses together: calling it returns all their named terms.

    Args:
        losses: the loss callables, each returning a one-entry dict.
    """

    def __init__(self, losses: Sequence[ReidLoss]):
        self.losses = tuple(losses)

    def __call__(self, outputs: Dict[str, torch.Tensor], targets: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Compute every loss on the head ``outputs`` and labels ``targets`` (B,).

        Returns:
            dict: ``{"loss_cls": ..., "loss_triplet": ..., ...}`` scalar tensors, already scaled.
        """
        terms: Dict[str, torch.Tensor] = {}
        for loss in self.losses:
            terms.update(loss(outputs, targets))
        return terms

    def __repr__(self) -> str:
        return f"LossSet({', '.join(repr(loss) for loss in self.losses)})"


def registered_loss_names():
    """Sorted names accepted in MODEL.LOSSES.NAME."""
    return LOSS_REGISTRY.names()


def check_loss_names(cfg) -> tuple:
    """Check MODEL.LOSSES.NAME: at least one registered loss, each named once.

    Args:
        cfg: the full config.
    Returns:
        tuple of the loss names.
    Raises:
        UnknownChoiceError: an unregistered name (one line: key, choices, closest).
        ConfigError: no name, or a name given twice.
    """
    names = cfg.MODEL.LOSSES.NAME
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names:
        raise ConfigError(f"MODEL.LOSSES.NAME is empty; name at least one of "
                          f"{', '.join(registered_loss_names())}")
    if len(set(names)) != len(names):
        raise ConfigError(f"MODEL.LOSSES.NAME lists a loss twice: {list(names)}; name each once")
    for name in names:
        LOSS_REGISTRY.get(name)
    return names


def build_losses(cfg) -> LossSet:
    """Build the losses named in ``cfg.MODEL.LOSSES.NAME``.

    Args:
        cfg: the full config; only ``MODEL.LOSSES`` is read.

    Returns:
        LossSet: ``loss_fn(outputs, targets) -> dict[str, Tensor]``.
    """
    names = check_loss_names(cfg)
    loss_set = LossSet([LOSS_REGISTRY.build(name, cfg) for name in names])
    logger.info("Losses: %s", loss_set)
    return loss_set
