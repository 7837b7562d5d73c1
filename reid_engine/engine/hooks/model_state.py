"""Hooks that change the model between steps: precise BN statistics, layer freezing, the EMA teacher and
the compile guard (which may turn a compiled model eager)."""
import itertools
import logging
from typing import Iterable, Sequence

from fvcore.nn.precise_bn import get_bn_modules, update_bn_stats
from torch import nn

from ...runtime import compile_guard
from ...runtime.compile import eager_calls
from ...utils.comm import unwrap_model
from ...utils.events import EventStorage
from ..train_loop import HookBase

logger = logging.getLogger(__name__)


class CompileGuard(compile_guard.CompileGuard, HookBase):
    """The runtime's :class:`~reid_engine.runtime.compile_guard.CompileGuard` registered as a hook: its
    decision is checkpointed under the key ``CompileGuard`` and its summary logged after training."""


class PreciseBN(HookBase):
    """Recompute BatchNorm running statistics over ``num_iter`` batches with the
    weights fixed, at each period and after the last iteration. Disabled when the
    model has no BatchNorm layer in training mode."""

    def __init__(self, period: int, model: nn.Module, data_loader: Iterable, num_iter: int):
        """
        Args:
            period: iterations between updates (0: only at the end).
            model: the model (training mode); called on each batch.
            data_loader: an iterable of batches (a training loader).
            num_iter: number of batches per update.
        """
        self._period = period
        self._model = model
        self._data_loader = data_loader
        self._num_iter = num_iter
        self._data_iter = None
        self._disabled = len(get_bn_modules(model)) == 0
        if self._disabled:
            logger.info("PreciseBN is disabled: the model has no BatchNorm layer in training mode")

    def after_step(self):
        next_iter = self.trainer.iter + 1
        if next_iter == self.trainer.max_iter or (self._period > 0 and next_iter % self._period == 0):
            self.update_stats()

    def _batches(self):
        if self._data_iter is None:
            self._data_iter = iter(self._data_loader)
        for count in itertools.count(1):
            if count % 100 == 0:
                logger.info(f"Running precise-BN: {count}/{self._num_iter} batches")
            try:
                yield next(self._data_iter)
            except StopIteration:  # a finite loader: start another pass
                self._data_iter = iter(self._data_loader)
                yield next(self._data_iter)

    def update_stats(self) -> None:
        """Recompute the BN statistics now (no-op when disabled)."""
        if self._disabled:
            return
        if not get_bn_modules(self._model):
            logger.info("PreciseBN skipped: no BatchNorm layer is in training mode now")
            return
        logger.info(f"Running precise-BN for {self._num_iter} batches (statistics vary between runs)")
        # The model may write metrics in training mode: keep them out of the trainer's storage.
        # A compiled model runs these passes eagerly: without gradients and with BatchNorm's
        # momentum at 1 they would each add a graph (recompilations, CUDA graphs recorded once).
        buffers = [(bn, bn.running_mean, bn.running_var) for bn in get_bn_modules(self._model)]
        with EventStorage(), eager_calls(self._model):
            update_bn_stats(self._model, self._batches(), self._num_iter)
        # fvcore assigns new tensors; copy them into the old ones, whose addresses CUDA graphs
        # recorded (a new address would make them record the graph again).
        for bn, mean, var in buffers:
            mean.copy_(bn.running_mean)
            var.copy_(bn.running_var)
            bn.running_mean, bn.running_var = mean, var


def _matches_prefix(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


class LayerFreeze(HookBase):
    """Keep the modules named by ``freeze_layers`` (module-name prefixes, e.g.
    ``"backbone"`` or ``"heads.bottleneck"``) frozen for the first ``freeze_iters``
    iterations: in eval mode (re-applied before every step, since evaluation may set
    train mode) and without updates (their gradients are cleared after backward, so any
    torch optimizer skips them). They are released at iteration ``freeze_iters``.
    """

    def __init__(self, model: nn.Module, freeze_layers: Sequence[str], freeze_iters: int):
        """
        Args:
            model: the model (DDP-wrapped or not).
            freeze_layers: module-name prefixes.
            freeze_iters: number of frozen iterations.
        """
        self.model = model
        self.freeze_layers = [p.strip(".") for p in freeze_layers]
        self.freeze_iters = int(freeze_iters)
        inner = unwrap_model(model)
        self._modules = [m for n, m in inner.named_modules() if n and _matches_prefix(n, self.freeze_layers)]
        self._params = [p for n, p in inner.named_parameters() if _matches_prefix(n, self.freeze_layers)]
        unknown = [p for p in self.freeze_layers
                   if not any(n == p or n.startswith(p + ".") for n, _ in inner.named_modules())]
        if unknown:
            top = ", ".join(n for n, _ in inner.named_children())
            raise ValueError(f"MODEL.FREEZE_LAYERS names {unknown} which match no module of the model; "
                             f"use module-name prefixes such as: {top}")
        self.is_frozen = False

    def _freeze(self) -> None:
        for module in self._modules:
            module.eval()
        if not self.is_frozen:
            self.is_frozen = True
            logger.info(f"Freezing {self.freeze_layers} until iteration {self.freeze_iters}")

    def _release(self) -> None:
        for module in self._modules:
            module.train(self.model.training)
        self.is_frozen = False
        logger.info(f"Releasing the frozen layers {self.freeze_layers} at iteration {self.trainer.iter}")

    def before_step(self):
        if self.trainer.iter < self.freeze_iters:
            self._freeze()
        elif self.is_frozen:
            self._release()

    def after_backward(self):
        if self.is_frozen:
            for param in self._params:
                param.grad = None

    def after_train(self):
        if self.is_frozen:  # training ended while frozen: leave the model as it was built
            self._release()


class EMATeacher(HookBase):
    """Update a distillation model's EMA teacher after each optimizer step, i.e. call
    ``update_ema_teacher()`` of a model whose ``has_ema_teacher`` is True (the Distiller with
    KD.EMA.ENABLED). It must run before the periodic checkpointer, so a checkpoint holds
    the teacher of the iteration it was written at.
    """

    def __init__(self, model: nn.Module):
        """
        Args:
            model: the model (DDP-wrapped or not).
        """
        self._model = unwrap_model(model)

    def after_step(self):
        self._model.update_ema_teacher()
