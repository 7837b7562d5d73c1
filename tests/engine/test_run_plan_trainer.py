"""DefaultTrainer decides its run plan once (build_run_plan) and every piece follows it: the model's
layout and compilation, the step trainer's precision, the compile guard's mode, the writers' device."""
import dataclasses

import pytest
import torch

from reid_engine.engine.defaults import DefaultTrainer
from reid_engine.engine.train_loop import AMPTrainer, SimpleTrainer
from reid_engine.runtime.run_plan import build_run_plan

from ._engine_fixtures import capture_logs, info_logging, tiny_trainer_cfg  # noqa: F401 (info_logging: a fixture)

pytestmark = pytest.mark.usefixtures("info_logging")


def _cfg(data_root, out, *opts):
    return tiny_trainer_cfg(data_root, out, "SOLVER.MAX_EPOCH", 1, "DATALOADER.NUM_WORKERS", 0, *opts)


def test_the_trainer_follows_its_plan_and_logs_it_once(data_root, tmp_path):
    cfg = _cfg(data_root, tmp_path, "DATALOADER.NUM_WORKERS", 1)  # a plan no other test decides first
    with capture_logs() as logs:
        trainer = DefaultTrainer(cfg)
    assert trainer.plan is build_run_plan(cfg)  # the process's one plan of this config
    assert trainer.plan.loader_workers == 1
    assert type(trainer._trainer) is SimpleTrainer and trainer.plan.amp is None
    assert trainer.compile_guard.mode == "off" and not trainer.compile_guard.explicit
    assert trainer.model.weights_channels_last() is trainer.plan.channels_last is False
    tables = [m for m in logs.messages if m.startswith("Run plan (train):")]
    assert len(tables) == 1 and "| loader workers" in tables[0]


def test_an_overridden_plan_reaches_model_building_and_the_step_trainer(data_root, tmp_path):
    class Forced(DefaultTrainer):
        @classmethod
        def build_run_plan(cls, cfg):
            plan = super().build_run_plan(cfg)
            bf16 = dataclasses.replace(plan.amp or _amp(cfg), autocast=True)
            return dataclasses.replace(plan, channels_last=True, amp=bf16)

    def _amp(cfg):
        cfg = cfg.clone()
        cfg.defrost()
        cfg.SOLVER.AMP.ENABLED, cfg.SOLVER.AMP.DTYPE = True, "bfloat16"
        return build_run_plan(cfg, log=False).amp

    trainer = Forced(_cfg(data_root, tmp_path))
    assert trainer.model.weights_channels_last() is True
    assert trainer.model.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert isinstance(trainer._trainer, AMPTrainer) and trainer._trainer.autocast_enabled
    assert trainer._trainer.precision == torch.bfloat16
