"""SOLVER.CHECKPOINT_MAX_TO_KEEP reaches the PeriodicCheckpointer that DefaultTrainer builds."""
import logging
import os

import pytest

from reid_engine.config import get_cfg
from reid_engine.engine import hooks
from reid_engine.engine.defaults import DefaultTrainer
from reid_engine.utils.checkpoint import CheckpointScheduleError
from reid_engine.utils.errors import ReidUserError

CFG = os.path.join(os.path.dirname(__file__), "..", "e2e", "configs", "tiny_R18.yml")


@pytest.fixture(autouse=True)
def info_logging():
    """DefaultTrainer runs setup_logger when INFO is off; tests/conftest.py restores the logger."""
    logging.getLogger("reid_engine").setLevel(logging.INFO)


def _trainer(data_root, out, *opts):
    cfg = get_cfg()
    cfg.merge_from_file(CFG)
    cfg.merge_from_list(["DATASETS.ROOT", data_root, "OUTPUT_DIR", str(out), "DATASETS.TESTS", "()",
                         "SOLVER.MAX_EPOCH", 2, "SOLVER.CHECKPOINT_PERIOD", 1,
                         "INPUT.SIZE_TRAIN", "[32, 16]", "INPUT.SIZE_TEST", "[32, 16]", *opts])
    return DefaultTrainer(cfg)


def _periodic_hook(trainer):
    found = [h for h in trainer._hooks if isinstance(h, hooks.PeriodicCheckpointer)]
    assert len(found) == 1
    return found[0]


def test_max_to_keep_from_config_prunes_periodic_checkpoints(data_root, tmp_path):
    trainer = _trainer(data_root, tmp_path, "SOLVER.CHECKPOINT_MAX_TO_KEEP", 1)
    assert _periodic_hook(trainer).keep_last_n == 1
    periodic_hook = _periodic_hook(trainer)
    periodic_hook.max_iter = trainer.max_iter
    for it in range(trainer.max_iter):  # the hook's schedule, without the (slow) training steps
        trainer.iter = it
        periodic_hook.step(it)
    periodic = sorted(n for n in os.listdir(tmp_path) if n.startswith("model_0"))
    # two epochs, one save each; the older one was deleted
    assert periodic == [f"model_{2 * trainer.iters_per_epoch - 1:07d}.pth"]
    assert os.path.isfile(tmp_path / "model_final.pth")


def test_default_keeps_every_checkpoint_and_bad_values_are_user_errors(data_root, tmp_path):
    assert get_cfg().SOLVER.CHECKPOINT_MAX_TO_KEEP == 0
    assert _periodic_hook(_trainer(data_root, tmp_path / "all")).keep_last_n is None
    with pytest.raises(CheckpointScheduleError, match="SOLVER.CHECKPOINT_MAX_TO_KEEP") as err:
        _trainer(data_root, tmp_path / "bad", "SOLVER.CHECKPOINT_MAX_TO_KEEP", -1)
    assert isinstance(err.value, ReidUserError) and "\n" not in str(err.value)
