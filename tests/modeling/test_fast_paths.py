"""MODEL.CHANNELS_LAST and MODEL.COMPILE change how the model runs, never what it saves:
checkpoints keep the eager model's key names (no "_orig_mod." prefix) and the outputs stay
those of the eager, contiguous model."""
import pytest
import torch

from reid_engine.config import get_cfg
from reid_engine.modeling import build_model
from reid_engine.modeling.layers.cpu_bf16_conv import MatmulGradConv2d
from reid_engine.modeling.meta_arch import use_channels_last
from reid_engine.runtime.compile import normalize_compile_mode, resolve_compile_mode
from reid_engine.runtime.compiled import compile_record
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
    assert fast.weights_channels_last() and not plain.weights_channels_last()
    assert fast.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert list(fast.state_dict()) == list(plain.state_dict())
    images = torch.randint(0, 256, (2, 3, 64, 32), dtype=torch.uint8)
    assert fast.preprocess_image({"images": images}).is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(fast({"images": images}), plain({"images": images}), rtol=1e-4, atol=1e-4)


def test_channels_last_auto_follows_the_device_and_cpu_bf16_and_bad_values_are_clear():
    assert use_channels_last("auto", torch.device("cuda")) is True
    assert use_channels_last("auto", torch.device("cpu")) is False
    assert use_channels_last("auto", torch.device("cpu"), cpu_bf16=True) is True  # native bf16 autocast
    assert use_channels_last("off", torch.device("cpu"), cpu_bf16=True) is False
    assert use_channels_last("on", torch.device("cpu")) is True
    with pytest.raises(ReidUserError, match="MODEL.CHANNELS_LAST"):
        use_channels_last("yes", torch.device("cpu"))


@pytest.mark.parametrize("native, amp, expected", [("AMX", True, True), ("", True, False), ("AMX", False, False)])
def test_build_model_lays_out_cpu_bf16_training_channels_last_with_matmul_grad_convs(monkeypatch, native, amp,
                                                                                      expected):
    monkeypatch.setattr("reid_engine.utils.env.cpu_native_bf16", lambda: native)
    cfg = tiny_cfg(CHANNELS_LAST="auto", DEVICE="cpu")
    cfg.SOLVER.AMP.ENABLED = amp
    model = build_model(cfg)
    assert model.weights_channels_last() is expected
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(isinstance(m, MatmulGradConv2d) is expected for m in convs)


@pytest.mark.slow
def test_compiled_model_trains_and_saves_eager_key_names(monkeypatch, tmp_path):
    """torch.compile in place (eager backend here: the graph capture is what is tested, and
    inductor's C++ build would take minutes on a CI machine)."""
    torch.manual_seed(0)
    eager = build_model(tiny_cfg())
    torch.manual_seed(0)
    compiled = build_model(tiny_cfg(COMPILE=True, COMPILE_BACKEND="eager"))
    assert compile_record(compiled).mode == "default" and compile_record(eager) is None
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


@pytest.mark.parametrize("value, mode", [(True, "default"), (False, "off"), ("on", "default"), ("off", "off"),
                                         ("auto", "auto"), ("Reduce-Overhead", "reduce-overhead"),
                                         ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")])
def test_compile_modes_and_their_aliases(value, mode):
    assert normalize_compile_mode(value) == mode


def test_compile_yaml_booleans_still_load_and_bad_modes_name_the_choices(tmp_path):
    """Older files wrote MODEL.COMPILE: True; YAML reads a bare on / off as a boolean too."""
    for text, expected in (("True", "on"), ("false", "off"), ("off", "off"), ("reduce-overhead", "reduce-overhead")):
        path = tmp_path / "c.yml"
        path.write_text(f"MODEL:\n  COMPILE: {text}\n  CHANNELS_LAST: {text if text != 'reduce-overhead' else 'on'}\n")
        cfg = get_cfg()
        cfg.merge_from_file(str(path))
        assert cfg.MODEL.COMPILE == expected
    with pytest.raises(ReidUserError, match="MODEL.COMPILE.*reduce-overhead"):
        normalize_compile_mode("reduce-overheat")
    with pytest.raises(ReidUserError, match="expects str"):
        get_cfg().merge_from_list(["MODEL.WEIGHTS", "True"])  # only the on / off keys take booleans


def test_auto_compiles_cuda_training_in_cuda_graphs_and_keeps_the_cpu_and_eager_only_models_eager():
    class EagerOnly(torch.nn.Module):
        EAGER_ONLY_REASON = "its queue write is data-dependent"

    assert resolve_compile_mode("auto", torch.device("cuda"))[0] == "reduce-overhead"
    assert resolve_compile_mode("auto", torch.device("cpu"))[0] == "off"
    mode, reason = resolve_compile_mode("auto", torch.device("cuda"), EagerOnly())
    assert mode == "off" and "EagerOnly" in reason and "queue" in reason
    assert resolve_compile_mode("default", torch.device("cuda"), EagerOnly())[0] == "default"  # explicit wins


@pytest.mark.slow
def test_importing_the_engine_does_not_import_dynamo_scipy_or_sklearn():
    """torch._dynamo costs about 1 s of every command's start-up and scipy.sparse 0.2 s (every
    test that starts a command or a worker pays it): only compiling and clustering load them."""
    import subprocess
    import sys

    code = ("import sys, reid_engine.engine, reid_engine.modeling; "
            "print([m for m in ('torch._dynamo', 'scipy', 'sklearn') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
