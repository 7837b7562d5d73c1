"""Baseline and build_model: normalisation, eval features, training losses, logging."""
import collections
import dataclasses
import logging

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from reid_engine.modeling import META_ARCH_REGISTRY, Baseline, build_model
from reid_engine.modeling.meta_arch import summary
from reid_engine.modeling.meta_arch.build import check_model_config
from reid_engine.runtime.run_plan import build_run_plan
from reid_engine.utils.registry import UnknownChoiceError

from ._helpers import tiny_cfg


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = tiny_cfg("18x", **{"HEADS.WITH_BNNECK": True, "HEADS.NECK_FEAT": "after",
                             "LOSSES.NAME": ("CrossEntropyLoss", "TripletLoss")})
    return build_model(cfg)


def _batch(n=4, dtype=torch.uint8):
    images = torch.randint(0, 256, (n, 3, 32, 16), generator=torch.Generator().manual_seed(1))
    return {"images": images.to(dtype), "targets": torch.tensor([0, 0, 1, 1][:n]),
            "camids": torch.zeros(n, dtype=torch.long), "img_paths": [f"{i}.jpg" for i in range(n)]}


def test_build_model_places_model_and_keeps_pixel_stats_out_of_state_dict(model):
    assert isinstance(model, Baseline) and model.training
    assert model.device == torch.device("cpu")
    assert "pixel_mean" not in model.state_dict() and "pixel_std" not in model.state_dict()
    torch.testing.assert_close(model.pixel_mean.flatten(), torch.tensor([123.675, 116.28, 103.53]))
    assert model.pixel_std.shape == (1, 3, 1, 1)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_eval_returns_features_and_leaves_the_input_alone(model, dtype):
    batch = _batch(dtype=dtype)
    before = batch["images"].clone()
    model.eval()
    try:
        with torch.no_grad():
            features = model(batch)
            normalised = (before.float() - model.pixel_mean) / model.pixel_std
            expected = model.heads(model.backbone(normalised))
    finally:
        model.train()
    assert torch.equal(batch["images"], before) and batch["images"].dtype == dtype
    assert features.shape == (4, 512) and features.dtype == torch.float32
    torch.testing.assert_close(features, expected)


def test_training_returns_named_losses_that_backpropagate(model):
    batch = _batch()
    before = batch["images"].clone()
    losses = model(batch)
    assert set(losses) == {"loss_cls", "loss_triplet"}
    assert all(v.dim() == 0 and torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert model.backbone.conv1.weight.grad is not None
    assert model.heads.weight.grad.abs().sum() > 0
    assert torch.equal(batch["images"], before)
    model.zero_grad(set_to_none=True)


def test_training_passes_head_outputs_to_an_injected_loss():
    cfg = tiny_cfg("18x")
    seen = {}

    def loss_fn(outputs, targets):
        seen.update(outputs=outputs, targets=targets)
        return {"loss_cls": outputs["cls_outputs"].sum()}

    base = META_ARCH_REGISTRY.get("Baseline").from_config(cfg)
    model = Baseline(backbone=base.backbone, heads=base.heads, pixel_mean=[0, 0, 0],
                     pixel_std=[255, 255, 255], loss_fn=loss_fn)
    losses = model(_batch(2))
    assert set(seen["outputs"]) == {"cls_outputs", "pred_class_logits", "features"}
    assert seen["outputs"]["cls_outputs"].shape == (2, 5)
    assert seen["outputs"]["features"].shape == (2, 512)
    assert seen["targets"].tolist() == [0, 0] and "loss_cls" in losses


def test_bad_inputs_are_clear_errors(model):
    with pytest.raises(ValueError, match="needs a batch dict with 'targets'"):
        model({"images": _batch()["images"]})
    with pytest.raises(ValueError, match=r"images must be a \(B, C, H, W\) tensor"):
        model.eval()({"images": torch.zeros(3, 64, 32)})
    model.train()
    with pytest.raises(ValueError, match="PIXEL_MEAN has 3 values but MODEL.PIXEL_STD has 2"):
        Baseline(backbone=model.backbone, heads=model.heads, pixel_mean=[1, 2, 3], pixel_std=[1, 2])
    cfg = tiny_cfg("18x", META_ARCHITECTURE="NoSuchArch")
    with pytest.raises(UnknownChoiceError, match="unknown MODEL.META_ARCHITECTURE 'NoSuchArch': choose one of Baseline"):
        build_model(cfg)
    with pytest.raises(UnknownChoiceError, match="unknown MODEL.META_ARCHITECTURE 'NoSuchArch'"):
        check_model_config(cfg)


@pytest.mark.parametrize("key, value, message", [
    ("META_ARCHITECTURE", "baseline", "unknown MODEL.META_ARCHITECTURE 'baseline'.*did you mean Baseline[?]"),
    ("BACKBONE.DEPTH", "7x", "unknown MODEL.BACKBONE.DEPTH '7x': choose one of 18x, 34x, 50x, 101x, 152x"),
    ("HEADS.POOL_LAYER", "GeM", "unknown MODEL.HEADS.POOL_LAYER 'GeM'"),
    ("LOSSES.NAME", ("TripletLos",), "unknown MODEL.LOSSES.NAME 'TripletLos'.*did you mean TripletLoss[?]"),
])
def test_check_model_config_covers_the_parts_it_builds(key, value, message):
    with pytest.raises(UnknownChoiceError, match=message):
        check_model_config(tiny_cfg("18x", **{key: value}))
    check_model_config(tiny_cfg("18x"))  # the defaults pass


def test_head_width_comes_from_the_backbone_not_feat_dim():
    cfg = tiny_cfg("18x", **{"BACKBONE.FEAT_DIM": 7, "HEADS.EMBEDDING_DIM": 0})
    model = build_model(cfg).eval()
    assert model.heads.in_feat_dim == model.backbone.out_channels == 512
    with torch.no_grad():
        assert model(_batch()["images"]).shape[1] == 512


def test_build_model_logs_parameters_and_flops(caplog):
    with caplog.at_level(logging.INFO, logger="reid_engine.modeling.meta_arch"):
        model = build_model(tiny_cfg("18x"))
    assert "Model parameters: 11.18M" in caplog.text
    assert "Model FLOPs at 64x32" in caplog.text
    assert model.training  # FLOP counting restored the mode
    # flops of the first conv alone: 64 out x 3 in x 7 x 7 x 32 x 16 positions
    assert summary.count_flops(model, (64, 32)) > 64 * 3 * 49 * 32 * 16


def test_flops_are_counted_before_the_model_reaches_the_training_device(monkeypatch):
    """The FLOP trace must not run on the training device (it filled GPU memory); the meta
    device stands in for a GPU here: build_model must count while parameters are on the CPU."""
    from reid_engine.modeling.meta_arch import build as build_module

    seen = []
    counted = summary.log_model_summary

    def record(model, image_size):
        seen.append(next(model.parameters()).device.type)
        return counted(model, image_size)

    monkeypatch.setattr(build_module, "log_model_summary", record)
    cfg = tiny_cfg("18x")
    on_meta = dataclasses.replace(build_run_plan(cfg), device=torch.device("meta"))
    model = build_model(cfg, on_meta)
    assert seen == ["cpu"]
    assert next(model.parameters()).device.type == "meta"


class TensorsOn(TorchFunctionMode):
    """Counts the tensors that torch calls create on one device type, and their bytes."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type, self.calls, self.bytes = device_type, collections.Counter(), 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == self.device_type:
                self.calls[getattr(func, "__name__", str(func))] += 1
                self.bytes += tensor.untyped_storage().nbytes()
        return out


def test_the_model_reaches_its_device_as_one_copy_of_its_weights():
    """The device-independent half of the CUDA test below ("meta" stands in for the GPU): nothing
    runs on the training device but one move of each weight (the FLOP trace and the channels_last
    conversion happen before, on the CPU)."""
    cfg = tiny_cfg("18x")
    plan = dataclasses.replace(build_run_plan(cfg), device=torch.device("meta"), channels_last=True)
    with TensorsOn("meta") as created:
        model = build_model(cfg, plan)
    tensors = list(model.parameters()) + list(model.buffers())
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert created.calls == {"to": len(tensors)}
    assert created.bytes == sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the real allocator's peak)")
def test_building_on_cuda_leaves_only_the_weights_in_gpu_memory():
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    cfg = tiny_cfg("18x")
    cfg.MODEL.DEVICE = "cuda"
    cfg.INPUT.SIZE_TEST = [256, 128]
    model = build_model(cfg)
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    assert torch.cuda.max_memory_allocated() - before <= 1.05 * weights + (1 << 20)


def test_flop_counting_failure_is_only_a_warning(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("tracer exploded\nsecond line")

    monkeypatch.setattr(summary, "count_flops", broken)
    with caplog.at_level(logging.WARNING):
        model = build_model(tiny_cfg("18x"))
    assert isinstance(model, Baseline)
    assert "FLOPs not counted (RuntimeError: tracer exploded)" in caplog.text
