"""Checkpoints carry a checksum of their content, checked on every load; files without one
(older ones, fast-reid's) still load, and fast-reid-style loaders still read ours."""
import pytest
import torch
import torch.nn as nn
from fvcore.common.checkpoint import Checkpointer as FvcoreCheckpointer

from reid_engine.utils.checkpoint import Checkpointer, load_checkpoint_file
from reid_engine.utils.checksum import CHECKSUM_KEY, payload_checksum
from reid_engine.utils.errors import ReidUserError
from reid_engine.utils.safe_load import ChecksumMismatchError, CorruptCheckpointError


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32))


def _saved(tmp_path, name="model_0000004"):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 64)).sum().backward()
    opt.step()
    Checkpointer(model, str(tmp_path), optimizer=opt).save(name, iteration=4)
    return model, tmp_path / f"{name}.pth"


def _flip_one_weight_byte(path, tensor):
    """Flip a bit inside the stored bytes of `tensor` (torch.save keeps storages uncompressed)."""
    data = bytearray(path.read_bytes())
    offset = bytes(data).find(tensor.detach().numpy().tobytes())
    assert offset > 0, "tensor bytes not found in the file"
    data[offset + 5] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_bit_is_caught_on_load(tmp_path):
    model, path = _saved(tmp_path)
    assert load_checkpoint_file(str(path))["iteration"] == 4  # intact: loads, checksum consumed
    _flip_one_weight_byte(path, model[0].weight)
    # torch itself reads the damaged file without complaint...
    assert not torch.equal(torch.load(path, weights_only=True)["model"]["0.weight"], model[0].weight)
    # ...our loader does not.
    with pytest.raises(ChecksumMismatchError) as err:
        Checkpointer(_model(seed=1)).load(str(path))
    message = str(err.value)
    assert str(path) in message and "checksum" in message and "\n" not in message
    assert isinstance(err.value, CorruptCheckpointError) and isinstance(err.value, ReidUserError)


def test_loaded_content_has_no_checksum_entry_and_weights_match(tmp_path):
    model, path = _saved(tmp_path)
    fresh = _model(seed=3)
    extra = Checkpointer(fresh).load(str(path), checkpointables=[])
    assert CHECKSUM_KEY not in extra and extra["iteration"] == 4
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_files_without_a_checksum_still_load(tmp_path):
    model = _model()
    # fast-reid's layout: model, optimizer, scheduler, iteration; no checksum entry.
    legacy = tmp_path / "fastreid_model_final.pth"
    torch.save({"model": model.state_dict(), "optimizer": {}, "iteration": 99}, legacy)
    fresh = _model(seed=2)
    assert Checkpointer(fresh).load(str(legacy), checkpointables=[]) == {"optimizer": {}, "iteration": 99}
    assert torch.equal(fresh[0].weight, model[0].weight)


def test_fastreid_style_loaders_read_our_files(tmp_path):
    """fast-reid's Checkpointer is fvcore's; it hands extra entries (our checksum) back untouched."""
    model, path = _saved(tmp_path)
    fresh = _model(seed=4)
    extra = FvcoreCheckpointer(fresh).load(str(path), checkpointables=[])
    assert torch.equal(fresh[0].weight, model[0].weight)
    assert extra["checksum"].startswith("sha256:") and extra["iteration"] == 4
    # And a plain weights-only torch.load sees an ordinary dict.
    assert torch.load(path, weights_only=True)["model"].keys() == model.state_dict().keys()


def test_checksum_covers_values_keys_and_types():
    base = {"model": {"w": torch.arange(6.0).view(2, 3)}, "iteration": 4, "tags": {"a", "b"}}
    same = {"model": {"w": torch.arange(6.0).view(2, 3).t().contiguous().t()}, "iteration": 4, "tags": {"b", "a"}}
    assert payload_checksum(base) == payload_checksum(same)  # layout and set order do not matter
    changed = [
        {**base, "iteration": 5},
        {**base, "iteration": "4"},
        {**base, "model": {"w": torch.arange(6.0).view(3, 2)}},
        {**base, "model": {"w": torch.arange(6.0).view(2, 3).double()}},
        {**base, "model": {"v": torch.arange(6.0).view(2, 3)}},
    ]
    assert len({payload_checksum(c) for c in changed} | {payload_checksum(base)}) == len(changed) + 1
    assert payload_checksum({**base, CHECKSUM_KEY: "sha256:0"}) == payload_checksum(base)
