"""--resume when the checkpoint last_checkpoint names is truncated, corrupt or missing: one
warning line, then the newest loadable checkpoint of the folder; none loadable: one error line
listing what was tried. Nothing in the folder is changed either way."""
import logging
import os
import time

import pytest
import torch
import torch.nn as nn

from reid_engine.utils import checkpoint as ckpt_module
from reid_engine.utils.checkpoint import Checkpointer, NoLoadableCheckpointError, resume_candidates
from tests.conftest import records_of
from tests.e2e.test_train_net import RUN_FAILURE, snapshot, tiny_args


@pytest.fixture
def warnings_seen(caplog):
    with records_of(caplog, ckpt_module.__name__):
        yield caplog


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))


@pytest.fixture
def run_folder(tmp_path):
    """model_0000009 (weights of seed 9), model_0000019 (seed 19, tagged last): {iteration: model}."""
    out = tmp_path / "out"
    models = {}
    for it in (9, 19):
        models[it] = _model(it)
        Checkpointer(models[it], str(out)).save(f"model_{it:07d}", iteration=it)
    assert (out / "last_checkpoint").read_text() == "model_0000019.pth"
    return out, models


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _damage(path, how):
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "bit flip":
        data = bytearray(path.read_bytes())
        weight = max(torch.load(path, weights_only=True)["model"].values(), key=lambda t: t.numel())
        data[bytes(data).find(weight.numpy().tobytes()) + 3] ^= 0x01
        path.write_bytes(bytes(data))
    elif how == "missing":
        path.unlink()
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how,label", [("truncated", "truncated or corrupt"), ("bit flip", "checksum mismatch"),
                                       ("missing", "missing"), ("empty", "truncated or corrupt")])
def test_damaged_last_checkpoint_falls_back_to_the_previous_one(run_folder, warnings_seen, how, label):
    out, models = run_folder
    _damage(out / "model_0000019.pth", how)
    before = snapshot(out)
    model = _model(0)
    extra = Checkpointer(model, str(out)).resume_or_load("", resume=True)
    assert extra["iteration"] == 9 and _same(model, models[9])
    warnings = [r.getMessage() for r in warnings_seen.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert "last_checkpoint names model_0000019.pth" in warnings[0]
    assert "resuming from model_0000009.pth" in warnings[0] and f"model_0000019.pth ({label})" in warnings[0]
    assert snapshot(out) == before  # the damaged file is left for the user to look at


def test_nothing_loadable_is_one_error_listing_what_was_tried(run_folder):
    out, _ = run_folder
    _damage(out / "model_0000019.pth", "truncated")
    _damage(out / "model_0000009.pth", "bit flip")
    model, untouched = _model(0), _model(0)
    with pytest.raises(NoLoadableCheckpointError) as err:
        Checkpointer(model, str(out)).resume_or_load("", resume=True)
    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 1
    assert "model_0000019.pth (truncated or corrupt), model_0000009.pth (checksum mismatch)" in message
    assert str(out) in message and "--resume" in message
    assert _same(model, untouched)  # nothing half-loaded


def test_candidates_are_newest_first_with_final_and_best_placed_by_write_time(tmp_path):
    names = ["model_0000009.pth", "model_0000019.pth", "model_final.pth", "model_0000029.pth", "model_best.pth",
             "notes.pth", "model_0000039.pth.tmp"]
    for age, name in enumerate(names):  # written in this order, oldest first
        (tmp_path / name).write_bytes(b"x")
        stamp = time.time() - 100 + age
        os.utime(tmp_path / name, (stamp, stamp))
    order = [os.path.basename(p) for p in resume_candidates(str(tmp_path))]
    # model_final was written after model_0000019 (e.g. a finished run later resumed to a longer schedule).
    assert order == ["model_best.pth", "model_0000029.pth", "model_final.pth", "model_0000019.pth",
                     "model_0000009.pth"]


def test_cli_resume_with_nothing_loadable_is_one_line(data_root, tmp_path, capsys):
    """`reid-train --resume` (in-process: the command's own error boundary): no traceback, exit 1,
    the folder as it was."""
    from reid_engine.cli.train import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "model_0000008.pth").write_bytes(b"PK\x03\x04 cut short")
    (out / "last_checkpoint").write_text("model_0000008.pth")
    (out / "metrics.json").write_text('{"iteration": 7, "total_loss": 3.0}\n')
    before = snapshot(out)
    assert main(["--resume"] + tiny_args(data_root, out, "MODEL.BACKBONE.WIDTH_MULT", "0.25")) == RUN_FAILURE
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("reid-train: error: --resume: no checkpoint in"), err
    assert "model_0000008.pth (truncated or corrupt)" in err[0]
    after = snapshot(out)
    assert all(after[name] == data for name, data in before.items())


@pytest.mark.slow
def test_command_resumes_from_the_newest_loadable_checkpoint(data_root, tmp_path):
    """`reid-train --resume` (in-process) after the final and the last periodic checkpoint of a
    run were damaged: it continues from the one before, at the right iteration."""
    from reid_engine.cli.train import main

    out = tmp_path / "out"
    args = tiny_args(data_root, out, "MODEL.BACKBONE.WIDTH_MULT", "0.25", "DATASETS.TESTS", "()")
    assert main(args + ["SOLVER.MAX_EPOCH", "2"]) == 0  # 9 iterations an epoch: model_0000008, _0000017, _final
    _damage(out / "model_final.pth", "truncated")
    _damage(out / "model_0000017.pth", "bit flip")
    assert main(["--resume"] + args + ["SOLVER.MAX_EPOCH", "3"]) == 0
    log = (out / "log.txt").read_text()
    assert ("last_checkpoint names model_final.pth, which cannot be loaded; resuming from model_0000008.pth"
            in log)
    assert "skipped: model_final.pth (truncated or corrupt), model_0000017.pth (checksum mismatch)" in log
    assert "Starting training from iteration 9" in log
    assert (out / "last_checkpoint").read_text() == "model_final.pth"
    assert torch.load(out / "model_final.pth", weights_only=True)["iteration"] == 26
