"""DefaultTrainer decides its run plan once (build_run_plan) and every piece follows it: the model's
layout and compilation, the step trainer's precision, the compile guard's mode, the writers' device."""
import dataclasses
import logging
import os

import pytest
import torch

from reid_engine.config import get_cfg
from reid_engine.config.run_plan import build_run_plan
from reid_engine.engine.defaults import DefaultTrainer
from reid_engine.engine.train_loop import AMPTrainer, SimpleTrainer

from ._engine_fixtures import capture_logs

CFG = os.path.join(os.path.dirname(__file__), "..", "e2e", "configs", "tiny_R18.yml")


@pytest.fixture(autouse=True)
def info_logging():
    logging.getLogger("reid_engine").setLevel(logging.INFO)


def _cfg(data_root, out, *opts):
    cfg = get_cfg()
    cfg.merge_from_file(CFG)
    cfg.merge_from_list(["DATASETS.ROOT", data_root, "OUTPUT_DIR", str(out), "DATASETS.TESTS", "()",
                         "SOLVER.MAX_EPOCH", 1, "INPUT.SIZE_TRAIN", "[32, 16]", "INPUT.SIZE_TEST", "[32, 16]",
                         "DATALOADER.NUM_WORKERS", 0, *opts])
    return cfg


def test_the_trainer_follows_its_plan_and_logs_it_once(data_root, tmp_path):
    cfg = _cfg(data_root, tmp_path, "DATALOADER.NUM_WORKERS", 1)  # a plan no other test decides first
    with capture_logs() as logs:
        trainer = DefaultTrainer(cfg)
    assert trainer.plan is build_run_plan(cfg)  # the process's one plan of this config
    assert trainer.plan.loader_workers == 1
    assert type(trainer._trainer) is SimpleTrainer and trainer.plan.amp is None
    assert trainer.compile_guard.mode == "off" and not trainer.compile_guard.explicit
    assert trainer.model.channels_last is trainer.plan.channels_last is False
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
    assert trainer.model.channels_last is True
    assert trainer.model.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert isinstance(trainer._trainer, AMPTrainer) and trainer._trainer.autocast_enabled
    assert trainer._trainer.precision == torch.bfloat16
