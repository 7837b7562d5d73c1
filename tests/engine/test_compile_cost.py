"""runtime.compile_cost and CompileGuard's cost rule: auto compiles only when the saving over the
iterations left exceeds the compile cost; the record of an earlier run is read and written;
evaluations under auto run eager. CPU, torch.compile with the eager backend."""
import json
import os

import pytest
import torch
import torch._dynamo  # noqa: F401

from reid_engine.engine.hooks import CompileGuard
from reid_engine.runtime import compile_cost
from reid_engine.runtime.compiled import CompileRecord, compile_record, is_compiled, record_compilation

from ._engine_fixtures import Clock, TinyModel, capture_logs, make_trainer, one_torch_thread, short_compile_comparison  # noqa: F401

pytestmark = pytest.mark.usefixtures("short_compile_comparison")


def _auto_guard(trainer, timer, recipe="recipe-a", **kwargs):
    trainer.model.compile(backend="eager")
    record_compilation(trainer.model, CompileRecord("default"))
    guard = CompileGuard(trainer.model, "default", explicit=False, timer=timer, recipe=recipe, **kwargs)
    trainer.register_hooks([guard])
    trainer.compile_guard = guard
    return guard


def _summary(logs) -> dict:
    lines = [m for m in logs.messages if m.startswith("Compile summary: ")]
    assert lines, logs.messages
    return json.loads(lines[-1][len("Compile summary: "):])


def test_expected_saving_and_pays_off():
    est = compile_cost.CompileEstimate(compile_s=60.0, speedup=2.0, source="x")
    assert compile_cost.expected_saving(0.03, 1000, 2.0) == pytest.approx(15.0)
    assert compile_cost.expected_saving(0.03, 1000, 1.0) == 0.0
    assert compile_cost.pays_off(est, 0.03, 1000) == (False, pytest.approx(15.0))
    assert compile_cost.pays_off(est, 0.03, 5000)[0]  # 75 s saved > 60 s
    assert "1000 iterations left" in compile_cost.describe(est, 0.03, 1000)


def test_estimate_uses_defaults_then_the_record_of_an_earlier_run(tmp_path):
    est = compile_cost.estimate("k", "cuda")
    assert (est.compile_s, est.speedup) == (compile_cost.DEFAULT_COMPILE_S["cuda"], compile_cost.DEFAULT_SPEEDUP["cuda"])
    assert "defaults" in est.source
    compile_cost.record("k", 12.345, 2.5)
    compile_cost.record("k", 4.0, 2.6)  # a warm second run: the next estimate follows it
    est = compile_cost.estimate("k", "cuda")
    assert (est.compile_s, est.speedup) == (4.0, 2.6) and "2 so far" in est.source
    assert compile_cost.records_path() == os.path.join(str(tmp_path / "cache"), "compile_records.json")
    assert not [n for n in os.listdir(tmp_path / "cache") if n.startswith(".compile_records.")]  # no temp left
    with open(compile_cost.records_path(), "w") as f:
        f.write("{damaged")
    assert "defaults" in compile_cost.estimate("k", "cuda").source


def _compiled_as(model, mode, scope):
    """`model` with the compile mode and scope compile_model records for a model."""
    record_compilation(model, CompileRecord(mode, scope))
    return model


def test_recipe_key_changes_with_the_model_mode_scope_and_detail():
    cpu = torch.device("cpu")
    a = compile_cost.recipe_key(_compiled_as(TinyModel(), "reduce-overhead", "blocks"), cpu, "input (256, 128)")
    assert a == compile_cost.recipe_key(_compiled_as(TinyModel(), "reduce-overhead", "blocks"), cpu, "input (256, 128)")
    assert a != compile_cost.recipe_key(_compiled_as(TinyModel(with_bn=False), "reduce-overhead", "blocks"), cpu,
                                        "input (256, 128)")
    assert a != compile_cost.recipe_key(_compiled_as(TinyModel(), "default", "blocks"), cpu, "input (256, 128)")
    assert a != compile_cost.recipe_key(_compiled_as(TinyModel(), "reduce-overhead", "model"), cpu, "input (256, 128)")
    assert a != compile_cost.recipe_key(_compiled_as(TinyModel(), "reduce-overhead", "blocks"), cpu, "input (384, 128)")


def test_a_short_run_stays_eager_without_compiling():
    """CPU defaults (150 s, 1.0x) on 9 steps: nothing to gain, so nothing compiles."""
    trainer = make_trainer()
    guard = _auto_guard(trainer, Clock(0.05))
    with capture_logs() as logs:
        trainer.train(0, 9)
    assert not is_compiled(trainer.model) and not guard.fell_back
    assert torch._dynamo.utils.get_compilation_metrics() == []  # dynamo never ran
    summary = _summary(logs)
    assert summary["decision"] == "stayed eager" and summary["compile_s"] is None
    assert summary["estimate"]["compile_s"] == compile_cost.DEFAULT_COMPILE_S["cpu"]
    assert any("auto stays eager" in m and "7 iterations left" in m for m in logs.messages), logs.messages


def test_a_record_of_a_cheap_compile_makes_a_long_run_compile_and_the_run_updates_it():
    compile_cost.record("recipe-a", 0.5, 3.0)
    trainer = make_trainer()
    guard = _auto_guard(trainer, Clock(0.05))
    with capture_logs() as logs:
        trainer.train(0, 40)
    assert is_compiled(trainer.model) and guard.decision == "compiled"
    assert len(torch._dynamo.utils.get_compilation_metrics()) > 0
    assert any("auto compiles with mode default" in m and "earlier run" in m for m in logs.messages)
    summary = _summary(logs)
    assert summary["decision"] == "compiled" and summary["eager_step_s"] == pytest.approx(0.05)
    with open(compile_cost.records_path()) as f:
        entry = json.load(f)["recipe-a"]
    assert entry["runs"] == 2 and entry["speedup"] == pytest.approx(1.0)  # what this run measured (fake clock)


def test_weigh_cost_off_compiles_a_short_run():
    trainer = make_trainer()
    guard = _auto_guard(trainer, Clock(0.05), weigh_cost=False)
    trainer.train(0, 9)
    assert guard.decision == "compiled" and guard.estimate is None and is_compiled(trainer.model)


def test_evaluation_under_auto_runs_eager_and_compiles_nothing():
    compile_cost.record("recipe-a", 0.0, 3.0)
    trainer = make_trainer()
    guard = _auto_guard(trainer, Clock(0.05))
    trainer.train(0, 9)
    assert is_compiled(trainer.model)
    before = len(torch._dynamo.utils.get_compilation_metrics())
    batch = next(iter(trainer.data_loader))
    trainer.model.eval()
    with torch.no_grad():
        guard.evaluate(lambda: trainer.model(batch))  # eval mode, no grad: a new graph if it ran compiled
    assert len(torch._dynamo.utils.get_compilation_metrics()) == before and is_compiled(trainer.model)


def test_the_trainer_keeps_a_record_per_recipe_and_reads_compile_weigh_cost(data_root, tmp_path):
    """DefaultTrainer's guard: the recipe key of the built model, and MODEL.COMPILE_WEIGH_COST."""
    from reid_engine.config import get_cfg
    from reid_engine.engine.defaults import DefaultTrainer

    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(os.path.dirname(__file__), "..", "e2e", "configs", "tiny_R18.yml"))
    cfg.merge_from_list(["DATASETS.ROOT", data_root, "OUTPUT_DIR", str(tmp_path / "out"), "MODEL.COMPILE", "default",
                         "MODEL.COMPILE_BACKEND", "eager", "MODEL.COMPILE_WEIGH_COST", False])
    trainer = DefaultTrainer(cfg)
    guard = trainer.compile_guard
    assert guard.recipe and not guard.weigh_cost and compile_record(trainer.model).scope == "model"
