"""MODEL.COMPILE at run time: ``auto`` protects itself, an explicit mode fails in one line.

Nobody watches a compiled run on a GPU, so a compiled step that fails, recompiles again and
again, or is slower than eager must not cost the run. :class:`CompileGuard` runs each training
step of a compiled model (``SimpleTrainer.compile_guard``) and each evaluation
(``DefaultTrainer``), and under ``auto`` turns the model back to eager for the rest of the run,
with one log line naming the reason, when:

a. compiling or capturing raises (an unsupported op, no C++ compiler for inductor): the step
   is redone eagerly on the same batch (nothing was applied: the optimizer steps last);
b. recompilations after warm-up pass :data:`RECOMPILE_CAP` (the line names the failed guard);
c. the compiled steady-state step is slower than the eager one: the first
   :data:`EAGER_STEPS` steps run eagerly (warm-up anyway), then the compiled steps after
   their compilation are timed, and the medians compared (the device is synchronised for
   these timed steps only). A recompilation after that decision (a new graph, e.g. when
   FREEZE_LAYERS ends) starts the comparison again.

Before anything compiles, ``auto`` also weighs the cost: after its eager steps it compiles
only when the expected saving over the iterations left exceeds the expected compile time
(``runtime.compile_cost``: an earlier run's record of the same recipe, else defaults), so a
short run or a fine-tune stays eager; the log line gives the estimate. A run that freezes layers
first (SOLVER.FREEZE_ITERS) recompiles at their release, so the frozen model's graph only serves
the frozen iterations: when compiling does not pay over those alone, ``auto`` stays eager until
the release and compares there from the start (the model compiles once). Evaluations under
``auto`` run eager: a test pass would recompile the model (eval mode, no gradients) for
longer than compiled inference saves on a test set.

An explicit mode never falls back: (a) and (b) raise :class:`CompileFailedError` (one line,
with MODEL.COMPILE off as the fix), and (c) is only logged. A fallback is part of the
checkpoint, so a resumed run does not compile a model that already failed (one that stayed
compiled is compared again). One line gives the compile time: the first compiled steps
minus as many steady compiled steps; one ``Compile summary: {json}`` line gives the figures
for scripts (tools/gpu_acceptance.py reads it).
"""
import dataclasses
import json
import logging
import os
import statistics
import time
import traceback
from typing import Callable, List, Optional

import torch
from torch import nn

from ..utils import comm
from ..utils.errors import ReidUserError, first_line
from . import compile_cost
from .compile import eager_calls, uncompile_model
from .compiled import compile_count, is_compiled, mark_step_begin

__all__ = ["CompileGuard", "CompileFailedError", "RECOMPILE_CAP", "EAGER_STEPS", "COMPILE_WARMUP_STEPS",
           "TIMED_STEPS", "is_compile_error"]

logger = logging.getLogger(__name__)

#: eager steps timed first under auto (the first is warm-up and left out of the median)
EAGER_STEPS = 4
#: first compiled steps not timed: compilation, then CUDA graphs' warm-up run and recording
COMPILE_WARMUP_STEPS = 3
#: compiled steps timed after those (their median is the steady-state compiled step)
TIMED_STEPS = 5
#: steps (or evaluations) that recompiled after warm-up, allowed: FREEZE_LAYERS ending (when the
#: frozen model was compiled) and an explicit mode's first evaluation take one each (however many
#: graphs or blocks they compile); a model that keeps recompiling passes the cap within a few steps
RECOMPILE_CAP = 4

# Where torch.compile's own frames live: an exception raised through them came from
# tracing, compiling or replaying (CUDA graphs), not from the eager model.
_COMPILER_DIRS = tuple(os.path.join("torch", name) + os.sep for name in ("_dynamo", "_inductor", "_functorch"))


class CompileFailedError(ReidUserError, RuntimeError):
    """An explicit MODEL.COMPILE mode failed (a compile error, or recompiling past the cap)."""


def is_compile_error(exc: BaseException) -> bool:
    """Whether an exception came from torch.compile (tracing, code generation, CUDA graphs).

    User errors, out-of-memory and interrupts are not compile errors, even when raised
    inside a compiled graph.

    Args:
        exc: the exception a compiled call raised.
    Returns:
        True for an error that eager execution would not have raised.
    """
    if isinstance(exc, (ReidUserError, torch.OutOfMemoryError)) or not isinstance(exc, Exception):
        return False
    if isinstance(exc, torch._dynamo.exc.TorchDynamoException):
        return True
    # Raised where torch.compile's own code or its generated code runs (every compiled call
    # passes through torch/_dynamo/eval_frame.py, so only the innermost frame tells).
    frames = traceback.extract_tb(exc.__traceback__)
    where = frames[-1].filename if frames else ""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or "\0"
    return any(part in where for part in _COMPILER_DIRS) or where.startswith(cache)


def _compile_error_text(exc: BaseException, limit: int = 240) -> str:
    """``Type: [InnerType: ]first line of the innermost cause``, shortened to `limit` characters
    (torch wraps a backend's error, e.g. BackendCompilerFailed around InductorError)."""
    inner = exc
    for _ in range(8):
        cause = getattr(inner, "inner_exception", None) or inner.__cause__
        if not isinstance(cause, BaseException) or cause is inner:
            break
        inner = cause
    text = f"{type(inner).__name__}: {first_line(inner)}" if str(inner).strip() else type(inner).__name__
    if inner is not exc:
        text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _guard_name(reason: str) -> str:
    """The failed guard of a dynamo recompile reason ("0/1: L['self'].k == 3  # source ..." -> "L['self'].k == 3")."""
    first = reason.strip().splitlines()[0] if reason.strip() else "unknown guard"
    first = first.split("#", 1)[0].strip()
    return first.split(": ", 1)[1].strip() if ": " in first[:12] else first


class CompileGuard:
    """Runs the steps of a compiled model and decides whether it stays compiled (see the module doc).

    The loop knows it as a hook (``engine.hooks.CompileGuard``: its state is checkpointed, its
    summary logged after training, ``trainer`` is the trainer) and as ``SimpleTrainer.compile_guard``,
    which runs each step on a fetched batch through :meth:`run_step`. A model that is not compiled
    passes straight through.

    A comparison (auto: eager steps, then compiled steps) runs at the start of each process
    and again after a recompilation that follows a decision (a new graph, e.g. when
    FREEZE_LAYERS ends, may be slow where the first was fast), or at the release of frozen
    layers when it waited for it.

    Attributes:
        fell_back: auto turned the model back to eager.
        reason: why (empty while it stays compiled).
        compile_seconds: the estimated time of the last compilation (None until measured).
        waited_for_release: the iteration of the release auto waited for to compile (None: no wait).
        trainer: the trainer whose steps it runs (its ``iter``, ``max_iter``, ``warmup_step``); None alone.
    """

    trainer = None

    def __init__(self, model: nn.Module, mode: str, explicit: bool, recompile_cap: int = RECOMPILE_CAP,
                 timer: Callable[[], float] = time.perf_counter, recipe: str = "", weigh_cost: bool = True,
                 frozen_until: int = 0):
        """
        Args:
            model: the trained model (DDP-wrapped or not), compiled in place or eager.
            mode: the torch.compile mode in use ("off" when eager).
            explicit: MODEL.COMPILE named the mode (never fall back) rather than auto.
            recompile_cap: steps that may recompile after warm-up.
            timer: the clock of the step timings (tests inject one).
            recipe: the ``compile_cost.recipe_key`` of this compilation (its record is read and
                written); "" keeps no record and estimates from the defaults.
            weigh_cost: under auto, stay eager when compiling would not pay for itself in the
                iterations left (needs the trainer: its ``max_iter`` and ``iter``).
            frozen_until: the iteration at which frozen layers are released (the LayerFreeze hook's
                ``freeze_iters``; 0: nothing is frozen). With `weigh_cost`, auto waits for it to
                compile when compiling the frozen model would not pay before the release.
        """
        self.model = model
        self.mode = mode
        self.explicit = explicit
        self.recipe = recipe
        self.weigh_cost = weigh_cost
        self.frozen_until = int(frozen_until)
        self.waited_for_release: Optional[int] = None
        self._waiting = False  # eager steps until the release of the frozen layers
        self.estimate: Optional[compile_cost.CompileEstimate] = None
        self.decision = "compiled" if mode != "off" else "eager"
        self.recompile_cap = int(recompile_cap)
        self.timer = timer
        self.fell_back = False
        self.reason = ""
        self.compile_seconds: Optional[float] = None
        self._comparing = True  # the steps of a comparison (or, explicit, of the compile-time estimate)
        self._trial = 0  # steps into it
        self._eager_times: List[float] = []
        self._compiled_times: List[float] = []
        self._recompiles: List[str] = []  # reasons of the recompilations after warm-up
        self._seen_metrics = 0.0  # start time (us) of the last compilation looked at
        self._resumed_state: dict = {}
        self._eager_step: Optional[float] = None  # median eager step of the last comparison
        self._compiled_step: Optional[float] = None
        self._logged_summary = ""  # the last summary line logged (the same one is not repeated)
        self._compiles_at_step: Optional[int] = None  # torch.compile's count at the last compiled step's start

    @property
    def _eager_steps(self) -> int:
        return 0 if self.explicit else EAGER_STEPS

    @property
    def warming_up(self) -> bool:
        """Whether the steps are the guard's comparison (eager timing, compilation, timed
        compiled steps): their times are not the run's steady speed."""
        return self.active and self._comparing

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """{"mode", "fell_back", "reason"} (checkpointed with the trainer); for an eager run,
        what it resumed from ({} if nothing), so a later compiled resume still knows."""
        if self.mode == "off":
            return dict(self._resumed_state)
        return {"mode": self.mode, "fell_back": self.fell_back, "reason": self.reason}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the decision: a model auto turned to eager before stays eager (no recompiling);
        one that stayed compiled is compared again (another process, maybe another machine)."""
        self._resumed_state = dict(state_dict)
        if self.explicit:
            return  # an explicit mode is the user's choice for this part of the run
        if state_dict.get("fell_back") and is_compiled(self.model):
            self._fall_back(str(state_dict.get("reason", "")), earlier=True)

    # ------------------------------------------------------------------ steps
    @property
    def active(self) -> bool:
        """Whether the model's calls run compiled now."""
        return not self.fell_back and is_compiled(self.model)

    def step_may_be_long(self) -> bool:
        """Whether the coming step may last long enough to be worth interrupting (and undoing).

        Compilation and graph capture happen in a compiled model's steps: while the guard warms up
        (the first compiled steps: compilation, CUDA graphs' warm-up and recording), in the first
        compiled step of a process, and in the step after one in which torch.compile compiled (a
        recompilation; CUDA graphs record in the call after a compilation; an evaluation may have
        compiled too). A recompilation that comes unannounced in steady training (a guard failing)
        is not covered: a stop waits for that step, as for every eager step. Call it once per step.
        """
        if not self.active:
            return False
        compiles, last = compile_count(), self._compiles_at_step
        self._compiles_at_step = compiles
        return self.warming_up or last is None or compiles != last

    def run_step(self, step: Callable[[], None]) -> None:
        """Run one training step (forward, backward, optimizer step on a fetched batch).

        Args:
            step: runs the step; it must be safe to call again after it raised before the
                optimizer step (the eager retry of a failed compiled step).
        Raises:
            CompileFailedError: an explicit mode failed to compile or recompiled past the cap.
        """
        if not self.active:
            step()
            return
        if self._waiting:
            if int(self.trainer.iter) < self.frozen_until:
                with eager_calls(self.model):  # an ordinary step: the frozen model's graph is never compiled
                    step()
                return
            self._waiting, self.estimate, self.decision, self.reason = False, None, "compiled", ""
            self._compare_again()  # released: the whole comparison, cost rule included, from the start
        if self._comparing and self._trial < self._eager_steps:
            self._trial += 1
            with eager_calls(self.model):
                self._eager_times.append(self._timed(step))
            return
        index = self._trial - self._eager_steps  # compiled steps into the comparison
        if self._comparing and index == 0 and self._eager_times and not self._compile_pays():
            with eager_calls(self.model):  # eager for good (uncompiled), or until the release: nothing compiled
                step()
            return
        timed = self._comparing and index < COMPILE_WARMUP_STEPS + TIMED_STEPS
        self._trial += 1
        if timed and index < COMPILE_WARMUP_STEPS:
            self._one_off_step()
        try:
            mark_step_begin(self.model)
            seconds = self._timed(step) if timed else step()
        except Exception as exc:
            if not is_compile_error(exc):
                raise
            self._compile_failed(exc, f"at iteration {self._iteration()}")
            self._one_off_step()
            step()  # the same batch, eagerly: the failed step applied nothing
            return
        if timed:
            self._compiled_times.append(seconds)
        self._check_recompiles(warm=not timed or index >= COMPILE_WARMUP_STEPS)
        if timed and index == COMPILE_WARMUP_STEPS + TIMED_STEPS - 1 and self.active:
            self._decide()

    def evaluate(self, run: Callable[[], object]):
        """Run an evaluation of the model: eager under auto; under an explicit mode compiled, where a
        compile error fails in one line.

        Args:
            run: runs the evaluation and returns its results (eager under auto, see the module doc).
        Returns:
            what `run` returned.
        """
        if not self.active:
            return run()
        if not self.explicit:
            with eager_calls(self.model):  # auto: a test pass would recompile for longer than it saves
                return run()
        try:
            return run()
        except Exception as exc:
            if not is_compile_error(exc):
                raise
            self._compile_failed(exc, "in evaluation")
            return run()

    # ------------------------------------------------------------------ rules
    def _timed(self, step: Callable[[], None]) -> float:
        """Seconds one step takes, the device synchronised before and after."""
        self._synchronize()
        start = self.timer()
        step()
        self._synchronize()
        return self.timer() - start

    def _synchronize(self) -> None:
        param = next(self.model.parameters(), None)
        if param is not None and param.device.type == "cuda":
            torch.cuda.synchronize(param.device)

    def _one_off_step(self) -> None:
        """Flag this step as paying a one-off cost (compilation, graph capture, a redone step):
        the IterationTimer leaves it out of ``time``, the ETA and the overall speed."""
        if self.trainer is not None:
            self.trainer.warmup_step = True

    def _iteration(self):
        return getattr(self.trainer, "iter", "?") if self.trainer is not None else "?"

    def _compile_failed(self, exc: Exception, where: str) -> None:
        """Rule (a): fall back under auto, fail in one line under an explicit mode."""
        cause = f"torch.compile failed {where}: {_compile_error_text(exc)}"
        if self.explicit:
            raise CompileFailedError(f"MODEL.COMPILE {self.mode}: {cause} (set MODEL.COMPILE off to train eager, "
                                     "or auto to fall back to eager by itself)") from exc
        logger.debug("torch.compile error", exc_info=exc)
        self._fall_back(cause)

    def _check_recompiles(self, warm: bool) -> None:
        """Rule (b): count dynamo's recompilations (with their failed guard) after warm-up."""
        metrics = [m for m in torch._dynamo.utils.get_compilation_metrics()
                   if (m.start_time_us or 0) > self._seen_metrics]
        if not metrics:
            return
        self._seen_metrics = max(m.start_time_us or 0 for m in metrics)
        self._one_off_step()  # it compiled (or, after an evaluation, the evaluation did)
        if not warm:
            return
        reasons = [m.recompile_reason for m in metrics if m.recompile_reason]
        if not reasons:
            return
        # One step that recompiles counts once, however many graphs it compiled (a new shape
        # meets every block of a compiled-blocks model).
        self._recompiles.append(reasons[-1])
        if len(self._recompiles) <= self.recompile_cap:
            if not self._comparing and not self.explicit:  # a new graph after the decision: compare again
                logger.info("Compile: recompiled because the guard `%s` failed: comparing compiled and eager "
                            "steps again", _guard_name(self._recompiles[-1]))
                self._compare_again()
            return
        cause = (f"{len(self._recompiles)} steps recompiled after warm-up (more than {self.recompile_cap}), the "
                 f"last because the guard `{_guard_name(self._recompiles[-1])}` failed")
        if self.explicit:
            raise CompileFailedError(f"MODEL.COMPILE {self.mode}: {cause} (set MODEL.COMPILE off to train eager, or "
                                     "find the changing value with TORCH_LOGS=recompiles)")
        self._fall_back(cause)

    def _compare_again(self) -> None:
        """Start a new comparison: eager steps, then compiled ones."""
        self._comparing, self._trial, self._eager_times, self._compiled_times = True, 0, [], []

    def _decide(self) -> None:
        """Rule (c) and the compile-time line, once the timed compiled steps are in.

        Each worker of a DDP job decides for itself (no collective here: a worker that fell
        back earlier would never join it); a worker running eager only differs in speed.
        """
        self._comparing = False
        warmup, steady = self._compiled_times[:COMPILE_WARMUP_STEPS], self._compiled_times[COMPILE_WARMUP_STEPS:]
        compiled = statistics.median(steady)
        self.compile_seconds = max(0.0, sum(warmup) - len(warmup) * compiled)
        logger.info("Compile: compiling took about %.1f s (the first %d compiled steps took %.1f s, a compiled "
                    "step %.4f s)", self.compile_seconds, len(warmup), sum(warmup), compiled)
        self._compiled_step = compiled
        if not self._eager_times:  # an explicit mode: the figures only
            self._log_summary()
            return
        eager = self._eager_step = self._eager_median()
        if self.recipe and comm.get_local_rank() == 0:
            compile_cost.record(self.recipe, self.compile_seconds, eager / compiled if compiled > 0 else 1.0)
        if compiled > eager:
            self._fall_back(f"the compiled step ({compiled:.4f} s) is slower than the eager step ({eager:.4f} s)")
        else:
            logger.info("Compile: auto keeps torch.compile mode %s: a compiled step takes %.4f s against %.4f s "
                        "eager (%.2fx)", self.mode, compiled, eager, eager / compiled if compiled > 0 else float("inf"))
            self._log_summary()

    def _eager_median(self) -> float:
        """The median eager step of the comparison (its first step, a warm-up, left out)."""
        return statistics.median(self._eager_times[1:] or self._eager_times)

    def _compile_pays(self) -> bool:
        """Under auto, before the first compiled step: whether compiling is expected to pay for
        itself in the iterations left; if not, the model stays eager (one log line either way).
        While layers are frozen, only the frozen iterations left count (the release compiles
        again); if they do not pay, the model runs eager until the release (one log line)."""
        if self.explicit or not self.weigh_cost or self.trainer is None or self.estimate is not None:
            return True
        eager = self._eager_step = self._eager_median()
        now, end = int(self.trainer.iter), int(self.trainer.max_iter)
        device = next(self.model.parameters()).device.type
        self.estimate = compile_cost.estimate(self.recipe, device)
        pays, saving = compile_cost.pays_off(self.estimate, eager, end - now)
        text = compile_cost.describe(self.estimate, eager, end - now, saving)
        if not pays:
            uncompile_model(self.model)
            self.decision, self.reason, self._comparing = "stayed eager", f"would not pay for itself: {text}", False
            logger.info("Compile: auto stays eager, compiling would not pay for itself: %s", text)
            self._log_summary()
            return False
        if now < self.frozen_until < end:  # a release within the run: the graph compiled now serves until then
            frozen = self.frozen_until - now
            pays, saving = compile_cost.pays_off(self.estimate, eager, frozen)
            if not pays:
                text = compile_cost.describe(self.estimate, eager, frozen, saving)
                self._waiting, self._comparing, self.waited_for_release = True, False, self.frozen_until
                self.decision, self.reason = "waiting for the release", f"compiling the frozen model: {text}"
                logger.info("Compile: auto waits for the release of the frozen layers at iteration %d to compile "
                            "(the release would compile the frozen model again): until then %s",
                            self.frozen_until, text)
                return False
        logger.info("Compile: auto compiles with mode %s: %s", self.mode, text)
        return True

    def summary(self) -> dict:
        """The figures of this run's compilation (the ``Compile summary`` line's JSON)."""
        return {"mode": self.mode, "decision": self.decision, "reason": self.reason,
                "compile_s": self.compile_seconds, "eager_step_s": self._eager_step,
                "compiled_step_s": self._compiled_step, "recompiles": len(self._recompiles),
                "estimate": dataclasses.asdict(self.estimate) if self.estimate is not None else None,
                "waited_for_release": self.waited_for_release}

    def _log_summary(self) -> None:
        """Log the summary line, unless it is the one logged last."""
        text = json.dumps(self.summary())
        if text != self._logged_summary:
            self._logged_summary = text
            logger.info("Compile summary: %s", text)

    def after_train(self):
        """Log the summary line of a compiled run once training ends."""
        if self.mode != "off":
            self._log_summary()

    def _fall_back(self, reason: str, earlier: bool = False) -> None:
        """Turn the model back to eager for the rest of the run, with one log line."""
        uncompile_model(self.model)
        self.fell_back, self.reason, self._comparing = True, reason, False
        self.decision = "fell back"
        when = "fell back to eager in an earlier part of this run and stays eager" if earlier else \
            "falls back to eager for the rest of the run"
        logger.warning("Compile: auto %s: %s", when, reason)
        self._log_summary()
