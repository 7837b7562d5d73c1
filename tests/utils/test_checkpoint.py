"""Checkpointer / PeriodicCheckpointer: atomic saves, safe loads, layouts, keep-last-N, resume."""
import logging
import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from reid_engine.utils import checkpoint as ckpt_module
from reid_engine.utils.checkpoint import (
    Checkpointer,
    CheckpointError,
    PeriodicCheckpointer,
    format_load_summary,
    load_checkpoint_file,
)
from reid_engine.utils.errors import ReidUserError
from reid_engine.utils.file_io import AtomicWritePathManager
from tests.conftest import records_of


@pytest.fixture
def logs(caplog):
    """Records of the checkpoint logger, even if an app logger stopped propagation."""
    with records_of(caplog, ckpt_module.__name__):
        yield caplog


def _model(seed=0, out=3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, out), nn.BatchNorm1d(out))


def _optimizer(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()  # creates momentum buffers: real optimizer state to round-trip
    return opt


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _last(folder):
    return (folder / "last_checkpoint").read_text()


# ------------------------------------------------------------------ saving


def test_save_writes_contents_and_last_checkpoint(tmp_path):
    model = _model()
    opt = _optimizer(model)
    Checkpointer(model, str(tmp_path), optimizer=opt).save("model_0000004", iteration=4)
    assert _last(tmp_path) == "model_0000004.pth"
    data = torch.load(tmp_path / "model_0000004.pth", weights_only=True)
    assert set(data) == {"model", "optimizer", "iteration", "checksum"} and data["iteration"] == 4
    assert data["checksum"].startswith("sha256:")
    assert torch.equal(data["model"]["0.weight"], model[0].weight)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []

    fresh = _model(seed=1)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.5, momentum=0.9)
    extra = Checkpointer(fresh, str(tmp_path), optimizer=fresh_opt).load(str(tmp_path / "model_0000004.pth"))
    assert extra == {"iteration": 4}
    assert _same_weights(fresh, model)
    assert fresh_opt.param_groups[0]["lr"] == 0.1
    assert torch.equal(fresh_opt.state[fresh[0].weight]["momentum_buffer"], opt.state[model[0].weight]["momentum_buffer"])


def test_non_writing_process_saves_nothing(tmp_path):
    Checkpointer(_model(), str(tmp_path), save_to_disk=False).save("model_final")
    Checkpointer(_model(), "").save("model_final")
    assert list(tmp_path.iterdir()) == []
    assert Checkpointer(_model(), str(tmp_path)).save_to_disk  # default: main process writes


def _fail_replace_into(monkeypatch, suffix):
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith(suffix):
            raise OSError("simulated crash before the rename")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


def test_crash_before_rename_keeps_previous_checkpoint(tmp_path, monkeypatch):
    good = _model(seed=0)
    Checkpointer(good, str(tmp_path)).save("model_0000009")
    Checkpointer(good, str(tmp_path)).save("model_final")
    other = _model(seed=1)
    with monkeypatch.context() as m:
        _fail_replace_into(m, ".pth")
        with pytest.raises(OSError, match="simulated crash"):
            Checkpointer(other, str(tmp_path)).save("model_0000019")
        with pytest.raises(OSError, match="simulated crash"):
            Checkpointer(other, str(tmp_path)).save("model_final")  # overwriting an existing name
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["last_checkpoint", "model_0000009.pth", "model_final.pth"]  # no partial, no temp
    assert _last(tmp_path) == "model_final.pth"
    loaded = _model(seed=2)
    Checkpointer(loaded, str(tmp_path)).load(str(tmp_path / _last(tmp_path)))
    assert _same_weights(loaded, good)


def test_crash_while_tagging_leaves_tag_on_complete_file(tmp_path, monkeypatch):
    Checkpointer(_model(), str(tmp_path)).save("model_0000009")
    with monkeypatch.context() as m:
        _fail_replace_into(m, "last_checkpoint")
        with pytest.raises(OSError):
            Checkpointer(_model(seed=1), str(tmp_path)).save("model_0000019")
    assert _last(tmp_path) == "model_0000009.pth"
    assert (tmp_path / "model_0000019.pth").is_file()  # complete; just not tagged
    Checkpointer(_model(), str(tmp_path)).load(str(tmp_path / "model_0000019.pth"))


def test_temp_file_of_a_killed_writer_is_cleaned_up(tmp_path):
    stale = tmp_path / ".model_final.pth.0123abcd.tmp"
    stale.write_bytes(b"half a checkpoint")
    Checkpointer(_model(), str(tmp_path)).save("model_final")
    assert not stale.exists()
    assert Checkpointer(_model(), str(tmp_path)).get_all_checkpoint_files() == [str(tmp_path / "model_final.pth")]


# ------------------------------------------------------------------ loading: bad files


def run_code_on_unpickle(marker):
    """Stands for an attacker's payload: creates `marker` when called."""
    with open(marker, "w") as f:
        f.write("code ran")
    return "payload"


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (run_code_on_unpickle, (self.marker,))


def test_unsafe_pickle_is_refused_unless_opted_in(tmp_path, monkeypatch):
    monkeypatch.delenv("REID_ALLOW_UNSAFE_LOAD", raising=False)
    marker = tmp_path / "marker"
    source = _model(seed=0)
    path = tmp_path / "evil.pth"
    torch.save({"model": source.state_dict(), "note": _Payload(str(marker))}, path)

    with pytest.raises(CheckpointError) as err:
        Checkpointer(_model(seed=1)).load(str(path))
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    assert "allow_unsafe_load=True" in message and "REID_ALLOW_UNSAFE_LOAD=1" in message
    assert "run_code_on_unpickle" in message
    assert not marker.exists()  # nothing ran

    target = _model(seed=1)
    extra = Checkpointer(target, allow_unsafe_load=True).load(str(path))
    assert marker.exists() and extra == {"note": "payload"}
    assert _same_weights(target, source)

    marker.unlink()
    monkeypatch.setenv("REID_ALLOW_UNSAFE_LOAD", "1")
    Checkpointer(_model(seed=1)).load(str(path))
    assert marker.exists()


def test_truncated_corrupt_and_missing_files_name_the_path(tmp_path):
    path = tmp_path / "model_final.pth"
    Checkpointer(_model(), str(tmp_path)).save("model_final")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as err:
        Checkpointer(_model()).load(str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)

    text = tmp_path / "notes.pth"
    text.write_text("not a checkpoint\n")
    with pytest.raises(CheckpointError, match=f"{text}.*not a readable checkpoint"):
        Checkpointer(_model()).load(str(text))

    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere.pth")):
        Checkpointer(_model()).load(str(tmp_path / "nowhere.pth"))

    torch.save({"weights": [1, 2, 3]}, tmp_path / "odd.pth")
    with pytest.raises(CheckpointError, match="not a model checkpoint.*weights"):
        Checkpointer(_model()).load(str(tmp_path / "odd.pth"))


# ------------------------------------------------------------------ loading: layouts


def test_layouts_and_module_prefix(tmp_path):
    source = _model(seed=0)
    sd = source.state_dict()
    layouts = {
        "ddp.pth": {"model": {f"module.{k}": v for k, v in sd.items()}, "iteration": 7},
        "bare.pth": dict(sd),  # torchvision style
        "torchreid.pth": {"state_dict": dict(sd), "epoch": 3},
        "fastreid.pth": {"model": dict(sd), "optimizer": {"state": {}, "param_groups": []}, "iteration": 99},
    }
    for name, content in layouts.items():
        torch.save(content, tmp_path / name)
        target = _model(seed=1)
        extra = Checkpointer(target).load(str(tmp_path / name))
        assert _same_weights(target, source), name
        assert "model" not in extra and "state_dict" not in extra
        loaded = load_checkpoint_file(str(tmp_path / name))  # the same rules without a model
        assert sorted(k.replace("module.", "") for k in loaded["model"]) == sorted(sd)


def test_loads_into_a_ddp_wrapped_model(tmp_path):
    source = _model(seed=0)
    Checkpointer(source, str(tmp_path)).save("model_final")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(_model(seed=1))
        Checkpointer(wrapped).load(str(tmp_path / "model_final.pth"))
        assert _same_weights(wrapped.module, source)
    finally:
        dist.destroy_process_group()


def test_shape_mismatch_missing_and_unexpected_keys_are_summarised(tmp_path, logs):
    source = _model(seed=0, out=5)
    sd = dict(source.state_dict())
    del sd["1.running_var"]
    sd["extra.head.weight"] = torch.zeros(2)
    torch.save({"model": sd}, tmp_path / "other.pth")

    target = _model(seed=1, out=3)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    Checkpointer(target).load(str(tmp_path / "other.pth"))  # must not raise
    after = target.state_dict()
    assert torch.equal(after["0.weight"], before["0.weight"])  # (5, 4) vs (3, 4): skipped
    assert torch.equal(after["1.num_batches_tracked"], sd["1.num_batches_tracked"])  # same shape: loaded

    summaries = [r.getMessage() for r in logs.records if r.getMessage().startswith("Loaded ")]
    assert len(summaries) == 1 and logs.records[-1].levelno == logging.WARNING
    text = summaries[0]
    assert f"Loaded 1 of 7 model tensors from {tmp_path / 'other.pth'}." in text
    assert "0.weight: (5, 4) vs (3, 4)" in text and "1.running_mean: (5,) vs (3,)" in text
    assert "Not in the checkpoint, left as initialized (1):\n  1.running_var" in text
    assert "In the checkpoint but not used by the model (1):\n  extra.head.weight" in text


def test_format_load_summary_hand_written():
    text = format_load_summary(
        "w.pth", 10, ["heads.weight", "backbone.bn1.bias", "backbone.bn1.weight"], ["fc.weight", "fc.bias"],
        [("backbone.conv1.weight", (64, 3, 7, 7), (32, 3, 7, 7))],
    )
    assert text == (
        "Loaded 6 of 10 model tensors from w.pth.\n"
        "Skipped 1 with a different shape (checkpoint vs model):\n"
        "  backbone.conv1.weight: (64, 3, 7, 7) vs (32, 3, 7, 7)\n"
        "Not in the checkpoint, left as initialized (3):\n"
        "  backbone.bn1.{bias, weight}\n"
        "  heads.weight\n"
        "In the checkpoint but not used by the model (2):\n"
        "  fc.{bias, weight}"
    )
    many = format_load_summary("w.pth", 100, [f"m{i}.w" for i in range(30)], [], [])
    assert many.splitlines()[-1] == "  ... and 10 more" and len(many.splitlines()) == 23


# ------------------------------------------------------------------ periodic saves


def _periodic_files(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("model_"))


def test_periodic_schedule_and_keep_last_n_survive_a_restart(tmp_path):
    model = _model()
    (tmp_path / "model_best.pth").write_bytes(b"kept")
    periodic = PeriodicCheckpointer(Checkpointer(model, str(tmp_path)), 2, max_iter=10, max_to_keep=2)
    for it in range(6):
        periodic.step(it)
    assert _periodic_files(tmp_path) == ["model_0000003.pth", "model_0000005.pth", "model_best.pth"]
    assert torch.load(tmp_path / "model_0000005.pth", weights_only=True)["iteration"] == 5

    # A restarted job: a new instance knows nothing in memory, the folder tells it.
    restarted = PeriodicCheckpointer(Checkpointer(model, str(tmp_path)), 2, max_iter=10, max_to_keep=2)
    for it in range(6, 10):
        restarted.step(it)
    assert _periodic_files(tmp_path) == [
        "model_0000007.pth", "model_0000009.pth", "model_best.pth", "model_final.pth"]
    assert _last(tmp_path) == "model_final.pth"


def test_keep_last_n_never_deletes_the_tagged_file(tmp_path):
    checkpointer = Checkpointer(_model(), str(tmp_path))
    periodic = PeriodicCheckpointer(checkpointer, 1, max_to_keep=1)
    for it in range(3):
        checkpointer.save(f"model_{it:07d}")
    checkpointer.tag_last_checkpoint("model_0000000.pth")
    deleted = periodic.delete_old_checkpoints()
    assert [os.path.basename(p) for p in deleted] == ["model_0000001.pth"]
    assert _periodic_files(tmp_path) == ["model_0000000.pth", "model_0000002.pth"]


def test_periodic_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="period"):
        PeriodicCheckpointer(Checkpointer(_model(), str(tmp_path)), 0)
    with pytest.raises(ValueError, match="max_to_keep"):
        PeriodicCheckpointer(Checkpointer(_model(), str(tmp_path)), 5, max_to_keep=0)


# ------------------------------------------------------------------ resume_or_load


def test_resume_or_load(tmp_path, logs):
    out = tmp_path / "output"
    trained = _model(seed=0)
    trained_opt = _optimizer(trained)
    Checkpointer(trained, str(out), optimizer=trained_opt).save("model_0000019", iteration=19)
    weights = tmp_path / "weights.pth"
    pretrained = _model(seed=5)
    torch.save({"model": pretrained.state_dict()}, weights)

    # --resume with a last_checkpoint: everything restored, MODEL.WEIGHTS ignored (and said).
    model = _model(seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    extra = Checkpointer(model, str(out), optimizer=opt).resume_or_load(str(weights), resume=True)
    assert extra == {"iteration": 19} and _same_weights(model, trained) and opt.param_groups[0]["lr"] == 0.1
    assert f"MODEL.WEIGHTS ({weights}) is ignored because training resumes from {out / 'model_0000019.pth'}" in logs.text

    # No resume: only the weights, the optimizer keeps its own state.
    model = _model(seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    extra = Checkpointer(model, str(out), optimizer=opt).resume_or_load(str(weights), resume=False)
    assert extra == {} and _same_weights(model, pretrained) and opt.param_groups[0]["lr"] == 0.5

    # --resume in an empty folder: said clearly, MODEL.WEIGHTS (if any) initialises the model.
    empty = tmp_path / "empty"
    logs.clear()
    model = _model(seed=1)
    Checkpointer(model, str(empty)).resume_or_load(str(weights), resume=True)
    assert f"no checkpoint found in {empty}: starting from scratch" in logs.text
    assert _same_weights(model, pretrained)
    model, untouched = _model(seed=1), _model(seed=1)
    assert Checkpointer(model, str(empty)).resume_or_load("", resume=True) == {}
    assert _same_weights(model, untouched)

    checkpointer = Checkpointer(model, str(out))
    assert checkpointer.has_checkpoint() and not Checkpointer(model, str(empty)).has_checkpoint()
    assert checkpointer.get_checkpoint_file() == str(out / "model_0000019.pth")
    assert checkpointer.get_all_checkpoint_files() == [str(out / "model_0000019.pth")]


def test_saving_objects_a_safe_load_refuses_warns_at_save_time(tmp_path, logs):
    marker = tmp_path / "marker"
    checkpointer = Checkpointer(_model(), str(tmp_path))
    checkpointer.save("model_0000000", note=_Payload(str(marker)))
    checkpointer.save("model_0000001", note=_Payload(str(marker)))
    warnings = [r.getMessage() for r in logs.records if "safe load refuses" in r.getMessage()]
    assert len(warnings) == 1 and "run_code_on_unpickle" in warnings[0] and "REID_ALLOW_UNSAFE_LOAD=1" in warnings[0]
    assert not marker.exists()
    logs.clear()
    Checkpointer(_model(), str(tmp_path)).save("model_final", iteration=3, rng={"numpy": np.random.get_state()})
    assert "safe load refuses" not in logs.text  # numpy RNG state is allowed
    assert Checkpointer(_model()).load(str(tmp_path / "model_final.pth"))["iteration"] == 3


# ------------------------------------------------------------------ the shared loader and its errors


def test_missing_file_is_a_user_error_and_tied_weights_are_not_missing(tmp_path, logs):
    with pytest.raises(ckpt_module.CheckpointNotFoundError) as err:
        load_checkpoint_file(str(tmp_path / "nowhere.pth"))
    assert isinstance(err.value, ReidUserError) and isinstance(err.value, FileNotFoundError)

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Linear(3, 3)
            self.decoder = nn.Linear(3, 3)
            self.decoder.weight = self.encoder.weight  # one tensor, two names

    source = Tied()
    sd = {k: v for k, v in source.state_dict().items() if k != "decoder.weight"}
    del sd["decoder.bias"]
    torch.save(sd, tmp_path / "tied.pth")
    target = Tied()
    Checkpointer(target).load(str(tmp_path / "tied.pth"))
    assert torch.equal(target.decoder.weight, source.encoder.weight)
    text = logs.text
    assert "Not in the checkpoint, left as initialized (1):\n  decoder.bias" in text  # not decoder.weight


def test_saves_go_through_fvcore_with_atomic_files(tmp_path, monkeypatch):
    """Saves (and fvcore's tag_last_checkpoint) write through our path manager; a failure inside torch.save
    leaves neither a partial file nor a temporary, and no tag."""
    model = _model()
    checkpointer = Checkpointer(model, str(tmp_path))
    assert isinstance(checkpointer.path_manager, AtomicWritePathManager)

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(RuntimeError, match="disk full"):
        checkpointer.save("model_0000001")
    assert list(tmp_path.iterdir()) == []
