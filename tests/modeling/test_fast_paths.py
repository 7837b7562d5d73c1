"""MODEL.CHANNELS_LAST and MODEL.COMPILE change how the model runs, never what it saves:
checkpoints keep the eager model's key names (no "_orig_mod." prefix) and the outputs stay
those of the eager, contiguous model."""
import pytest
import torch

from reid_engine.modeling import build_model
from reid_engine.modeling.meta_arch import use_channels_last
from reid_engine.utils.errors import ReidUserError

from ._helpers import tiny_cfg


@pytest.fixture(autouse=True)
def quiet_flops(monkeypatch):
    # build_model's FLOP count is tested elsewhere; it is the slow part of these builds
    monkeypatch.setattr("reid_engine.modeling.meta_arch.build.log_model_summary", lambda *a, **k: None)


def test_channels_last_keeps_keys_and_outputs():
    torch.manual_seed(0)
    plain = build_model(tiny_cfg(CHANNELS_LAST="off")).eval()
    torch.manual_seed(0)
    fast = build_model(tiny_cfg(CHANNELS_LAST="on")).eval()
    assert fast.channels_last and not plain.channels_last
    assert fast.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert list(fast.state_dict()) == list(plain.state_dict())
    images = torch.randint(0, 256, (2, 3, 64, 32), dtype=torch.uint8)
    assert fast.preprocess_image({"images": images}).is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(fast({"images": images}), plain({"images": images}), rtol=1e-4, atol=1e-4)


def test_channels_last_auto_follows_the_device_and_bad_values_are_clear():
    assert use_channels_last("auto", torch.device("cuda")) is True
    assert use_channels_last("auto", torch.device("cpu")) is False
    assert use_channels_last("on", torch.device("cpu")) is True
    with pytest.raises(ReidUserError, match="MODEL.CHANNELS_LAST"):
        use_channels_last("yes", torch.device("cpu"))


@pytest.mark.slow
def test_compiled_model_trains_and_saves_eager_key_names(monkeypatch, tmp_path):
    """torch.compile in place (eager backend here: the graph capture is what is tested, and
    inductor's C++ build would take minutes on a CI machine)."""
    original = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: original(self, backend="eager", **kw))
    torch.manual_seed(0)
    eager = build_model(tiny_cfg())
    torch.manual_seed(0)
    compiled = build_model(tiny_cfg(COMPILE=True))
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert not any("_orig_mod" in key for key in compiled.state_dict())
    batch = {"images": torch.randint(0, 256, (4, 3, 64, 32), dtype=torch.uint8), "targets": torch.tensor([0, 0, 1, 1])}
    losses = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        losses[name] = sum(model(batch).values())
        losses[name].backward()
    torch.testing.assert_close(losses["compiled"], losses["eager"], rtol=1e-4, atol=1e-4)
    torch.save(compiled.state_dict(), tmp_path / "compiled.pth")
    reloaded = build_model(tiny_cfg())
    reloaded.load_state_dict(torch.load(tmp_path / "compiled.pth", weights_only=True), strict=True)
