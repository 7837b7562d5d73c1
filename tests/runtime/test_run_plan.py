"""The run plan: one object decides device, precision, layout, compilation, batched augmentation and
loader workers, once per process; model building, the trainer and inference follow it."""
import dataclasses
import logging

import pytest
import torch

from reid_engine.config import get_cfg
from reid_engine.modeling import build_model
from reid_engine.modeling.meta_arch.cluster_contrast import ClusterContrast
from reid_engine.runtime.run_plan import (
    amp_decision,
    build_run_plan,
    compile_decision,
    device_augment_decision,
)
from reid_engine.utils.registry import UnknownChoiceError


def _cfg(**overrides):
    cfg = get_cfg()
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.BACKBONE.DEPTH", "18x", "MODEL.BACKBONE.PRETRAIN", False,
                         "MODEL.HEADS.NUM_CLASSES", 4, "INPUT.SIZE_TEST", [32, 16]])
    for key, value in overrides.items():
        cfg.merge_from_list([key, value])
    return cfg


def test_cpu_defaults_with_reasons_and_a_table():
    plan = build_run_plan(_cfg(**{"DATALOADER.NUM_WORKERS": 3}), log=False)
    assert plan.device == torch.device("cpu") and plan.amp is None and plan.autocast_dtype is None
    assert not plan.channels_last and not plan.cpu_bf16_weight_grad and not plan.device_augment
    assert plan.compile_mode == "off" and not plan.compile_explicit and plan.loader_workers == 3
    assert plan.reasons["compile_mode"] == "auto: eager on cpu (compiling was not faster there)"
    table = plan.table()
    for row in ("device", "precision", "gradient scaling", "channels_last", "compile", "CPU bf16 weight gradients",
                "device augmentation", "loader workers"):
        assert f"| {row} " in table, table
    assert "auto: eager on cpu" in table and "float32" in table


def test_decided_and_logged_once_per_config_and_purpose(caplog):
    cfg = _cfg(**{"DATALOADER.NUM_WORKERS": 5, "MODEL.CHANNELS_LAST": "on"})
    with caplog.at_level(logging.INFO, logger="reid_engine.runtime.run_plan"):
        first = build_run_plan(cfg)
        again = build_run_plan(cfg.clone())
        other = build_run_plan(_cfg(**{"DATALOADER.NUM_WORKERS": 6, "MODEL.CHANNELS_LAST": "on"}))
        evaluate = build_run_plan(cfg, purpose="evaluate")
    assert first is again and other is not first and other.loader_workers == 6
    assert evaluate is not first and evaluate.purpose == "evaluate"
    tables = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Run plan")]
    assert len(tables) == 3, tables  # train (5 workers), train (6 workers), evaluate: each once
    assert "| channels_last" in tables[0] and "on" in tables[0]


def test_wrong_values_fail_in_one_line():
    with pytest.raises(UnknownChoiceError, match="MODEL.COMPILE"):
        build_run_plan(_cfg(**{"MODEL.COMPILE": "reduce-overheat"}), log=False)
    with pytest.raises(UnknownChoiceError, match="MODEL.CHANNELS_LAST"):
        build_run_plan(_cfg(**{"MODEL.CHANNELS_LAST": "yes"}), log=False)
    with pytest.raises(UnknownChoiceError, match="purpose"):
        build_run_plan(_cfg(), purpose="deploy", log=False)


@pytest.mark.parametrize("native", ["AMX", ""])
def test_cpu_bf16_amp_decides_layout_weight_gradients_and_autocast_together(monkeypatch, native):
    monkeypatch.setattr("reid_engine.utils.env.cpu_native_bf16", lambda: native)
    plan = build_run_plan(_cfg(**{"SOLVER.AMP.ENABLED": True}), log=False)
    assert plan.cpu_bf16_weight_grad is bool(native) and plan.channels_last is bool(native)
    assert plan.autocast_dtype == (torch.bfloat16 if native else None) and not plan.grad_scaling
    model = build_model(_cfg(**{"SOLVER.AMP.ENABLED": True}), plan)
    assert model.weights_channels_last() is bool(native)  # model building follows the plan


def test_amp_decision_on_cpu_turns_float16_into_bfloat16_and_explains_itself(monkeypatch):
    monkeypatch.setattr("reid_engine.utils.env.cpu_native_bf16", lambda: "AMX")
    decision = amp_decision("float16", "cpu")
    assert decision.dtype == torch.bfloat16 and decision.autocast and not decision.grad_scaling
    messages = [m for _, m in decision.notes]
    assert messages[0].startswith("AMP float16 is not used on CPU") and messages[-1] == "AMP: autocast to bfloat16 on cpu"


def test_compile_decision_per_purpose_and_eager_only_architecture():
    cuda = torch.device("cuda")
    assert compile_decision("train", "auto", cuda) == ("reduce-overhead",
                                                        "auto: CUDA training runs in CUDA graphs (reduce-overhead)")
    mode, reason = compile_decision("train", "auto", cuda, ClusterContrast)
    assert mode == "off" and reason.startswith("auto: ClusterContrast trains eager (")
    assert compile_decision("train", "default", cuda, ClusterContrast)[0] == "default"  # explicit wins
    assert compile_decision("evaluate", "auto", cuda)[0] == "off"
    assert compile_decision("serve", "max-autotune", cuda)[0] == "off"


def test_the_plan_finds_the_architecture_through_its_registry():
    plan = build_run_plan(_cfg(**{"MODEL.META_ARCHITECTURE": "ClusterContrast"}), log=False)
    assert plan.compile_mode == "off" and "ClusterContrast trains eager" in plan.reasons["compile_mode"]


def test_device_augment_decision():
    assert device_augment_decision(_cfg(), "cuda") == (False, "no pad-crop, flip or erasing to move")  # defaults
    cfg = _cfg(**{"INPUT.FLIP.ENABLED": True})
    assert device_augment_decision(cfg, "cuda") == (True, "INPUT.DEVICE_AUGMENT auto")
    assert device_augment_decision(cfg, "cpu")[0] is False
    assert device_augment_decision(_cfg(**{"INPUT.FLIP.ENABLED": True, "INPUT.CJ.ENABLED": True}), "cuda") == (
        False, "INPUT.DEVICE_AUGMENT auto: INPUT.CJ must run after them")
    assert device_augment_decision(_cfg(**{"INPUT.FLIP.ENABLED": True, "INPUT.DEVICE_AUGMENT": "on"}), "cpu")[0]


def test_a_plan_is_a_plain_value():
    plan = build_run_plan(_cfg(), log=False)
    changed = dataclasses.replace(plan, channels_last=True)
    assert changed.channels_last and not plan.channels_last and changed.rows()[3][1] == "on"


def test_cpu_threads_from_the_usable_cpus_shared_by_local_workers():
    from reid_engine.runtime.plan_rules import cpu_threads

    assert cpu_threads(1, environ={}, usable=(2, "affinity 2")) == (2, "affinity 2 (OMP_NUM_THREADS overrides)")
    threads, reason = cpu_threads(2, environ={}, usable=(2, "cgroup quota 2 of affinity 64"))
    assert threads == 1 and reason == "cgroup quota 2 of affinity 64 shared by 2 processes (OMP_NUM_THREADS overrides)"
    assert cpu_threads(4, environ={}, usable=(2, "affinity 2"))[0] == 1
    assert cpu_threads(1, environ={"OMP_NUM_THREADS": "3"}, usable=(2, "affinity 2")) == (3, "OMP_NUM_THREADS 3")


def test_the_plan_applies_its_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    plan = build_run_plan(_cfg(), log=False)
    assert plan.threads == 1 and ("CPU threads", "1", "OMP_NUM_THREADS 1") in plan.rows()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        plan.apply_threads()
        assert torch.get_num_threads() == 1
        two = dataclasses.replace(plan, threads=2)
        two.apply_threads()
        assert torch.get_num_threads() == 1  # a cap: a lower count the process chose is kept
    finally:
        torch.set_num_threads(before)


def test_the_command_line_sets_the_wait_policy_from_the_load_and_keeps_the_user_s():
    import subprocess
    import sys

    from reid_engine.runtime.thread_policy import BUSY_ENV

    code = "import os; import reid_engine.cli; print(os.environ.get('OMP_WAIT_POLICY', 'unset'))"
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    for busy, user, policy in (("1.00", None, "PASSIVE"), ("0.00", None, "unset"), ("1.00", "ACTIVE", "ACTIVE")):
        env[BUSY_ENV] = busy  # what a launching command measured (this test's own load is not quiet)
        if user:
            env["OMP_WAIT_POLICY"] = user
        assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip() == policy
