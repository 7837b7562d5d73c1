"""CompileGuard under a layer freeze (SOLVER.FREEZE_ITERS): auto compiles the frozen model only when
the frozen iterations alone pay for it (the release compiles again); otherwise it runs eager until
the release and compiles once there. CPU, torch.compile with the eager backend, a fake clock."""
import dataclasses
import json

import pytest
import torch
import torch._dynamo  # noqa: F401

from reid_engine.engine.hooks import CompileGuard, LayerFreeze
from reid_engine.engine.train_loop import HookBase
from reid_engine.runtime import compile_cost
from reid_engine.runtime.compiled import CompileRecord, is_compiled, record_compilation

from ._engine_fixtures import (  # noqa: F401
    Clock,
    capture_logs,
    info_logging,
    make_trainer,
    one_torch_thread,
    short_compile_comparison,
    tiny_trainer_cfg,
)

pytestmark = pytest.mark.usefixtures("short_compile_comparison")

RELEASE = 20
#: the fake eager step: 1/16 s, so that sums of steps are exact (a compiled step exactly as fast)
STEP = 0.0625
#: steps of 1/16 s at 2x save 1/32 s an iteration: 1 s of compiling pays after 32 iterations
SLOW_COMPILE, FAST_COMPILE = 1.0, 0.2


class StepLog(HookBase):
    """Per iteration: dynamo's compilations so far, and whether the step was flagged one-off."""

    def __init__(self):
        self.compiles, self.one_off = {}, {}

    def after_step(self):
        self.compiles[self.trainer.iter] = len(torch._dynamo.utils.get_compilation_metrics())
        self.one_off[self.trainer.iter] = self.trainer.warmup_step


def _frozen_run(compile_s, explicit=False, frozen_until=RELEASE):
    """A trainer whose backbone is frozen until `frozen_until`, with the hooks in DefaultTrainer's
    order (the guard before LayerFreeze) and a record of `compile_s` seconds at 2x."""
    compile_cost.record("recipe-a", compile_s, 2.0)
    trainer = make_trainer()
    trainer.model.compile(backend="eager")
    record_compilation(trainer.model, CompileRecord("default"))
    guard = CompileGuard(trainer.model, "default", explicit=explicit, timer=Clock(STEP), recipe="recipe-a",
                         frozen_until=frozen_until)
    log = StepLog()
    trainer.register_hooks([guard, LayerFreeze(trainer.model, ["backbone"], frozen_until), log])
    trainer.compile_guard = guard
    return trainer, guard, log


def _summary(logs) -> dict:
    lines = [m for m in logs.messages if m.startswith("Compile summary: ")]
    assert lines, logs.messages
    return json.loads(lines[-1][len("Compile summary: "):])


def _waits(logs):
    return [m for m in logs.messages if "waits for the release" in m]


def test_a_short_freeze_runs_eager_until_the_release_and_compiles_once_there():
    trainer, guard, log = _frozen_run(SLOW_COMPILE)
    with capture_logs() as logs:
        trainer.train(0, 80)
    # 18 frozen iterations left save 0.56 s against 1 s of compiling: eager until the release.
    wait = _waits(logs)
    assert len(wait) == 1 and "at iteration 20" in wait[0] and "costs about 1 s" in wait[0] and "18 iterations left" in wait[0]
    assert log.compiles[RELEASE - 1] == 0
    # The waiting steps are ordinary ones (in the speed), not the comparison's.
    assert not any(log.one_off[it] for it in range(2, RELEASE))
    # At the release the comparison starts again: 2 eager steps, the cost rule over the 58 left, compile.
    assert log.compiles[RELEASE + 1] == 0 and log.compiles[RELEASE + 2] > 0 and log.one_off[RELEASE + 2]
    assert any("auto compiles with mode default" in m and "58 iterations left" in m for m in logs.messages)
    assert is_compiled(trainer.model) and guard.decision == "compiled"
    summary = _summary(logs)
    assert summary["decision"] == "compiled" and summary["reason"] == "" and summary["recompiles"] == 0
    assert summary["waited_for_release"] == RELEASE and summary["compile_s"] is not None
    assert not any("recompiled because" in m for m in logs.messages)


def test_a_long_freeze_that_pays_compiles_the_frozen_model_and_recompiles_at_the_release():
    trainer, guard, log = _frozen_run(FAST_COMPILE)  # 18 frozen iterations save 0.56 s > 0.2 s
    with capture_logs() as logs:
        trainer.train(0, 40)
    assert not _waits(logs) and log.compiles[2] > 0
    assert any("recompiled because the guard" in m and "training" in m for m in logs.messages), logs.messages
    summary = _summary(logs)
    assert summary["decision"] == "compiled" and summary["recompiles"] == 1 and summary["waited_for_release"] is None


def test_a_run_resumed_after_the_release_does_not_wait():
    trainer, guard, log = _frozen_run(SLOW_COMPILE)
    with capture_logs() as logs:
        trainer.train(30, 90)  # frozen until 20: nothing is frozen any more
    assert not _waits(logs) and guard.waited_for_release is None
    assert log.compiles[31] == 0 and log.compiles[32] > 0 and is_compiled(trainer.model)
    assert _summary(logs)["recompiles"] == 0


def test_an_explicit_mode_never_waits():
    trainer, guard, log = _frozen_run(SLOW_COMPILE, explicit=True)
    with capture_logs() as logs:
        trainer.train(0, 30)
    assert not _waits(logs) and log.compiles[0] > 0 and guard.waited_for_release is None
    assert _summary(logs)["recompiles"] == 1  # the release: the user's choice


def test_a_run_that_ends_frozen_never_compiles_and_says_so():
    trainer, guard, log = _frozen_run(SLOW_COMPILE, frozen_until=40)
    with capture_logs() as logs:
        trainer.train(0, 30)  # 28 iterations left save 0.88 s against 1 s: no release to wait for
    assert torch._dynamo.utils.get_compilation_metrics() == [] and not is_compiled(trainer.model)
    assert not _waits(logs)
    assert any("auto stays eager" in m and "28 iterations left" in m for m in logs.messages), logs.messages
    summary = _summary(logs)
    assert summary["decision"] == "stayed eager" and summary["waited_for_release"] is None


@pytest.mark.slow
def test_default_trainer_waits_for_the_release_and_compiles_once(data_root, tmp_path, info_logging):  # noqa: F811
    """DefaultTrainer under auto (made to compile on the CPU) with the backbone frozen: the guard
    gets LayerFreeze's release, waits for it and compiles the blocks once, after it."""
    from reid_engine.engine.defaults import DefaultTrainer

    class AutoOnCpu(DefaultTrainer):
        @classmethod
        def build_run_plan(cls, cfg):
            plan = super().build_run_plan(cfg)  # CPU auto plans eager: compile the blocks as on a GPU
            return dataclasses.replace(plan, compile_mode="default", compile_explicit=False, compile_scope="blocks")

    # quarter width and no periodic checkpoint: the steps and the saves were most of the test's time
    cfg = tiny_trainer_cfg(data_root, tmp_path, "MODEL.COMPILE_BACKEND", "eager", "SOLVER.FREEZE_ITERS", 8,
                           "MODEL.FREEZE_LAYERS", "['backbone']", "TEST.EVAL_PERIOD", 100,
                           "MODEL.BACKBONE.WIDTH_MULT", 0.25, "SOLVER.CHECKPOINT_PERIOD", 100)
    trainer = AutoOnCpu(cfg)
    guard = trainer.compile_guard
    freeze = [h for h in trainer._hooks if isinstance(h, LayerFreeze)]
    assert freeze and guard.frozen_until == freeze[0].freeze_iters == 8 and not guard.explicit
    # 6 frozen iterations left save 0.19 s against 0.2 s; after the release 0.2 s pays in 7 iterations.
    assert trainer.max_iter >= 20, trainer.max_iter
    compile_cost.record(guard.recipe, FAST_COMPILE, 2.0)
    guard.timer = Clock(STEP)
    with capture_logs() as logs:
        trainer.train()
    assert len(_waits(logs)) == 1 and "at iteration 8" in _waits(logs)[0], logs.messages
    assert is_compiled(trainer.model) and len(torch._dynamo.utils.get_compilation_metrics()) > 0
    summary = _summary(logs)
    assert summary["decision"] == "compiled" and summary["recompiles"] == 0 and summary["waited_for_release"] == 8
