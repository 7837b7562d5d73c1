"""The standard single-optimizer trainers: :class:`SimpleTrainer` (one model returning a dict of
losses, one loader, one optimizer) and :class:`AMPTrainer` (the same under mixed precision).

The hook contract and the loop itself are ``engine.trainer_base``'s (re-exported here); the
precision a run uses is the run plan's decision (``runtime.run_plan.amp_decision``).
"""

import contextlib
import logging
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Union

import numpy as np
import torch
from torch import nn

from ..reliability.step_guards import StepSnapshot
from ..runtime.run_plan import AMP_DTYPE_NAMES, AmpDecision, amp_decision, resolve_amp_dtype
from ..utils import comm
from ..utils.env import get_rng_states, set_rng_states
from ..utils.errors import ReidUserError
from ..utils.events import get_event_storage
from .trainer_base import HookBase, StepWrapper, TrainerBase

__all__ = ["HookBase", "StepWrapper", "TrainerBase", "SimpleTrainer", "AMPTrainer", "NonFiniteLossError", "write_metrics",
           "AMP_DTYPE_NAMES", "resolve_amp_dtype"]

logger = logging.getLogger(__name__)


class NonFiniteLossError(ReidUserError, FloatingPointError):
    """The loss became NaN or infinite; the message names the iteration and what to change."""


def _model_device_type(model: nn.Module) -> str:
    """Device type ("cpu", "cuda") of the model's first parameter or buffer."""
    for tensor in model.parameters():
        return tensor.device.type
    for tensor in model.buffers():
        return tensor.device.type
    return "cpu"


class SimpleTrainer(TrainerBase):
    """Trainer for the common case: one model returning a dict of losses, one data
    loader, one optimizer.

    Each step: load a batch (timed as ``data_time``), ``loss_dict = model(batch)``,
    sum, check it is finite, zero_grad, backward, ``after_backward`` hooks, write
    metrics, ``optimizer.step()``.

    A compiled model's step that may be long (:meth:`step_may_be_long`: compiling, recording
    CUDA graphs) is interruptible up to its optimizer step: the loop's step wrapper
    (``reliability.step_guards.InterruptibleSteps``) ends it at once on a stop signal and undoes
    it (:meth:`step_snapshot`). Eager steps and a compiled model's steady steps run as they are:
    a signal during them stops the run after the step.
    """

    def __init__(self, model: nn.Module, data_loader: Iterable, optimizer: torch.optim.Optimizer,
                 gather_metric_period: int = 1, zero_grad_before_forward: bool = False,
                 batch_augment: Optional[Callable[[dict], dict]] = None):
        """
        Args:
            model: returns a dict of scalar loss tensors (or one loss tensor) for a
                batch in training mode; may be DDP-wrapped.
            data_loader: an iterable of batches (infinite for iteration-based training);
                its ``state_dict``/``load_state_dict``, when present, are checkpointed.
            optimizer: a torch optimizer.
            gather_metric_period: every iteration's losses are staged on the device; every
                this many iterations they are fetched to the host in one transfer, checked
                for NaN / inf, gathered and written (with their own iteration numbers). A
                period > 1 keeps the steady-state step free of host synchronisation.
            zero_grad_before_forward: zero the gradients before the forward pass
                instead of before the backward pass.
            batch_augment: applied to each batch before the forward pass (e.g. the batched
                flip / pad-crop / erasing of INPUT.DEVICE_AUGMENT); its ``state_dict`` /
                ``load_state_dict`` are checkpointed.
        """
        super().__init__()
        model.train()
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer
        self.gather_metric_period = int(gather_metric_period)
        self.zero_grad_before_forward = zero_grad_before_forward
        self.batch_augment = batch_augment
        self._data_loader_iter_obj = None
        # (iteration, device tensor of the loss values, data time) per step since the last flush
        self._staged: List[tuple] = []
        self._loss_names: Optional[List[str]] = None
        # Runs the steps of a compiled model (runtime/compile_guard.py); None: steps run directly.
        self.compile_guard = None
        self._stream_at_stop: Optional[dict] = None  # the stream position of an interrupted step's start

    @property
    def _data_loader_iter(self):
        # Created on first use so a restored data-loader state applies to the stream.
        if self._data_loader_iter_obj is None:
            self._data_loader_iter_obj = iter(self.data_loader)
        return self._data_loader_iter_obj

    def restart_data_stream(self) -> None:
        """Drop the current iterator over the data loader: the next step starts a new one.

        For hooks that change what the loader yields (e.g. new pseudo labels), since an
        iterator, or a prefetcher over it, may already hold batches of the old stream.
        """
        self._data_loader_iter_obj = None

    def _autocast(self):
        """Context manager for the forward pass; plain precision here."""
        return contextlib.nullcontext()

    def _backward(self, losses: torch.Tensor) -> None:
        losses.backward()

    def _optimizer_step(self) -> None:
        self.optimizer.step()

    def run_step(self) -> None:
        """Run one training iteration: fetch a batch, augment it, train on it, write metrics when due."""
        if not self.model.training:
            raise RuntimeError("SimpleTrainer: the model is in eval mode; call model.train() before training")
        self._stream_at_stop = None
        start = time.perf_counter()
        data = next(self._data_loader_iter)
        data_time = time.perf_counter() - start
        if self.batch_augment is not None:
            data = self.batch_augment(data)
        if self.compile_guard is None:
            self.train_on_batch(data, data_time)
        else:  # it may redo a failed compiled step eagerly on the same batch
            self.compile_guard.run_step(lambda: self.train_on_batch(data, data_time))
        if (self.iter + 1) % self.gather_metric_period == 0:
            self.flush_metrics()

    def step_may_be_long(self) -> bool:
        """Whether this step may be long (its compile guard compiles or records CUDA graphs)."""
        return self.compile_guard is not None and self.compile_guard.step_may_be_long()

    def step_snapshot(self) -> Callable[[], None]:
        """Take what this step changes before its optimizer step (buffers, RNG, the stream's position,
        the augmentation's draws, a gradient scaler, the staged losses); returns its undo."""
        snapshot = StepSnapshot(self.model, self.data_loader, [self.batch_augment, getattr(self, "grad_scaler", None)])
        staged, loss_names = list(self._staged), self._loss_names

        def undo() -> None:
            self._stream_at_stop = snapshot.restore()
            self._staged, self._loss_names = staged, loss_names
        return undo

    def train_on_batch(self, data, data_time: float) -> None:
        """Forward, backward and optimizer step on one fetched batch; its losses are staged.

        Safe to call again on the same batch when it raised before the optimizer step (the
        gradients are zeroed before the backward pass, and a redone step replaces its staged losses).
        An override keeps a long step interruptible up to its optimizer step without doing anything.
        """
        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        with self._autocast():
            loss_dict = self.model(data)
            if isinstance(loss_dict, torch.Tensor):
                loss_dict = {"total_loss": loss_dict}
            if not isinstance(loss_dict, Mapping) or not loss_dict:
                raise TypeError(f"the model must return a non-empty dict of losses in training, got {type(loss_dict).__name__}")
            losses = sum(loss_dict.values())
        self._stage_metrics(loss_dict, data_time)
        if not self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        self._backward(losses)
        self.after_backward()
        self._optimizer_step()

    def _stage_metrics(self, loss_dict: Mapping[str, torch.Tensor], data_time: float) -> None:
        """Keep this step's loss values on the device (no host synchronisation)."""
        names = list(loss_dict)
        if self._loss_names is not None and names != self._loss_names:
            self.flush_metrics()  # the model changed its losses: write what was staged under the old names
        self._loss_names = names
        # stack copies: the staged values outlive the step (CUDA graphs overwrite the model's outputs)
        values = torch.stack([v.detach().float().reshape(()) for v in loss_dict.values()])
        if self._staged and self._staged[-1][0] == self.iter:  # the step was redone (CompileGuard)
            self._staged.pop()
        self._staged.append((self.iter, values, data_time))

    def flush_metrics(self, prefix: str = "") -> None:
        """Fetch the staged losses in one device-to-host transfer, check them, and write
        them to the event storage (gathered over workers, each at its own iteration).

        Called every ``gather_metric_period`` iterations, before a checkpoint is saved or
        an evaluation runs (hooks call it), and after training.

        Raises:
            NonFiniteLossError: a staged loss is NaN or infinite; the message names the
                first such iteration. Checkpoints flush first, so none holds its weights.
        """
        staged, self._staged = self._staged, []
        if not staged:
            return
        values = torch.stack([v for _, v, _ in staged]).cpu()  # the one host sync per period
        rows = [dict(zip(self._loss_names, row.tolist()), data_time=data_time)
                for row, (_, _, data_time) in zip(values, staged)]
        gathered = comm.gather(rows)  # every worker takes part before any of them raises
        finite = torch.isfinite(values).all(dim=1)
        if not bool(finite.all()):
            bad = int((~finite).nonzero()[0])
            text = ", ".join(f"{k}={v:.6g}" for k, v in rows[bad].items() if k != "data_time")
            later = f", seen at iteration {staged[-1][0]}" if staged[bad][0] != staged[-1][0] else ""
            raise NonFiniteLossError(
                f"Loss became infinite or NaN at iteration {staged[bad][0]}: {text}{later} "
                "(lower the learning rate or check the data; the checkpoints on disk are from before it)")
        for index, (iteration, _, _) in enumerate(staged):
            write_metrics([worker_rows[index] for worker_rows in gathered], prefix, iteration=iteration)


    def state_dict(self) -> dict:
        """TrainerBase state plus ``optimizer``, ``rng`` and (if supported) ``data_loader``
        and ``batch_augment``."""
        ret = super().state_dict()
        ret["optimizer"] = self.optimizer.state_dict()
        ret["rng"] = get_rng_states()
        if self._stream_at_stop is not None:  # an interrupted step had fetched a batch: not counted
            ret["data_loader"] = self._stream_at_stop
        elif hasattr(self.data_loader, "state_dict"):
            ret["data_loader"] = self.data_loader.state_dict()
        if self.batch_augment is not None:
            ret["batch_augment"] = self.batch_augment.state_dict()
        return ret

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore what :meth:`state_dict` saved; the data stream restarts from the
        restored loader state on the next step."""
        super().load_state_dict(state_dict)
        self._stream_at_stop = None
        if "optimizer" in state_dict:
            self.optimizer.load_state_dict(state_dict["optimizer"])
        if "rng" in state_dict:
            set_rng_states(state_dict["rng"])
        if "data_loader" in state_dict:
            if hasattr(self.data_loader, "load_state_dict"):
                self.data_loader.load_state_dict(state_dict["data_loader"])
                self.restart_data_stream()  # the next step iterates the restored stream
            else:
                logger.warning("The checkpoint holds a data loader state but this data loader "
                               "cannot load one: the data stream restarts")
        if self.batch_augment is not None and "batch_augment" in state_dict:
            self.batch_augment.load_state_dict(state_dict["batch_augment"])


def write_metrics(all_metrics: List[Dict[str, float]], prefix: str = "", iteration: Optional[int] = None) -> None:
    """Write per-worker metrics gathered on the main process into the event storage.

    ``data_time`` is the max over workers, losses the mean; ``total_loss`` is always
    written, the individual losses only when there are several. Other ranks (which
    receive an empty list from ``comm.gather``) write nothing.

    Args:
        all_metrics: one dict per worker with the loss values and ``data_time``.
        prefix: prepended to ``total_loss`` (e.g. for a second model).
        iteration: the iteration the values belong to (default: the storage's current one).
    """
    if not all_metrics:
        return
    storage = get_event_storage()
    storage.put_scalar("data_time", max(m["data_time"] for m in all_metrics), iteration=iteration)
    names = [k for k in all_metrics[0] if k != "data_time"]
    losses = {k: float(np.mean([m[k] for m in all_metrics])) for k in names}
    storage.put_scalar(f"{prefix}total_loss", sum(losses.values()), iteration=iteration)
    if len(losses) > 1:
        storage.put_scalars(iteration=iteration, **losses)


class AMPTrainer(SimpleTrainer):
    """SimpleTrainer with automatic mixed precision: autocast on the model's device,
    gradient scaling for float16 (bfloat16 needs none). On CPU only bfloat16 is used, and with
    precision "auto" only where the CPU computes it natively (AVX512-BF16 or AMX): elsewhere
    autocast would be emulated and much slower than float32, so the steps run in float32
    (``self.autocast_enabled`` is False) and the log says so (``runtime.run_plan.amp_decision``)."""

    def __init__(self, model: nn.Module, data_loader: Iterable, optimizer: torch.optim.Optimizer,
                 gather_metric_period: int = 1, zero_grad_before_forward: bool = False,
                 grad_scaler: Optional["torch.amp.GradScaler"] = None,
                 precision: Union[str, torch.dtype, AmpDecision] = "auto",
                 batch_augment: Optional[Callable[[dict], dict]] = None):
        """
        Args:
            model, data_loader, optimizer, gather_metric_period, zero_grad_before_forward,
                batch_augment: as for :class:`SimpleTrainer`.
            grad_scaler: a ``torch.amp.GradScaler`` for float16 (a default one is made).
            precision: the run plan's :class:`AmpDecision` (``plan.amp``), or torch.float16 /
                torch.bfloat16, their names, or "auto" (decided here by the same rule).
        """
        super().__init__(model, data_loader, optimizer, gather_metric_period, zero_grad_before_forward,
                         batch_augment=batch_augment)
        self.device_type = _model_device_type(model)
        decision = precision if isinstance(precision, AmpDecision) else amp_decision(precision, self.device_type)
        for level, message in decision.notes:
            logger.log(level, message)
        self.precision = decision.dtype
        self.autocast_enabled = decision.autocast
        if decision.grad_scaling:
            self.grad_scaler = grad_scaler if grad_scaler is not None else torch.amp.GradScaler(self.device_type)
        else:
            if grad_scaler is not None:
                logger.warning("AMP bfloat16 needs no gradient scaling: the given grad_scaler is not used")
            self.grad_scaler = None

    def _autocast(self):
        if not self.autocast_enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.precision)

    def _backward(self, losses: torch.Tensor) -> None:
        if self.grad_scaler is None:
            losses.backward()
        else:
            self.grad_scaler.scale(losses).backward()

    def _optimizer_step(self) -> None:
        if self.grad_scaler is None:
            self.optimizer.step()
        else:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()

    def state_dict(self) -> dict:
        """SimpleTrainer state plus ``grad_scaler`` (float16 only)."""
        ret = super().state_dict()
        if self.grad_scaler is not None:
            ret["grad_scaler"] = self.grad_scaler.state_dict()
        return ret

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore the SimpleTrainer state and the gradient scaler."""
        super().load_state_dict(state_dict)
        if "grad_scaler" in state_dict:
            if self.grad_scaler is not None:
                self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
            else:
                logger.info("The checkpoint holds a float16 grad scaler state; bfloat16 needs none: ignored")
