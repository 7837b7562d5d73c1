"""SOLVER.CHECKPOINT_MAX_TO_KEEP reaches the PeriodicCheckpointer that DefaultTrainer builds."""
import os

import pytest

from reid_engine.config import get_cfg
from reid_engine.engine import hooks
from reid_engine.engine.defaults import DefaultTrainer
from reid_engine.utils.checkpoint import CheckpointScheduleError
from reid_engine.utils.errors import ReidUserError

from ._engine_fixtures import info_logging, tiny_trainer_cfg  # noqa: F401 (info_logging: a fixture)

pytestmark = pytest.mark.usefixtures("info_logging")


def _trainer(data_root, out, *opts):
    return DefaultTrainer(tiny_trainer_cfg(data_root, out, "SOLVER.MAX_EPOCH", 2, "SOLVER.CHECKPOINT_PERIOD", 1, *opts))


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
