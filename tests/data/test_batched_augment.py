"""Batched flip / pad-crop / random erasing (INPUT.DEVICE_AUGMENT): the same distributions as the
per-image ops, determinism, exact state round trips, the pipeline split and exact trainer resume."""

import io
import logging

import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from reid_engine.config import get_cfg
from reid_engine.data.transforms import (
    BatchAugmentation,
    RandomErasing,
    RandomHorizontalFlip,
    RandomPadCrop,
    build_batch_augmentation,
    build_transforms,
    device_augment_enabled,
)
from reid_engine.engine.train_loop import SimpleTrainer
from reid_engine.utils.registry import UnknownChoiceError

N = 20000  # images per distribution test: frequencies within a few 1e-3 (5 sigma bounds below)


def _coordinates(n: int, height: int, width: int) -> torch.Tensor:
    """n identical images whose channel 0 holds row + 1 and channel 1 column + 1 (0 = padding)."""
    rows = torch.arange(1, height + 1, dtype=torch.uint8).view(height, 1).expand(height, width)
    cols = torch.arange(1, width + 1, dtype=torch.uint8).view(1, width).expand(height, width)
    return torch.stack([rows, cols, torch.full_like(rows, 7)]).expand(n, 3, height, width).contiguous()


def _frequencies(values: torch.Tensor, count: int) -> np.ndarray:
    return np.bincount(values.numpy(), minlength=count) / len(values)


def test_pad_crop_and_flip_offsets_and_flip_rate_match_the_per_image_ops():
    pad, size, p = 3, 8, 0.3
    augment = BatchAugmentation("cpu", seed=0, flip=RandomHorizontalFlip(p), pad_crop=RandomPadCrop(pad))
    out = augment.apply(_coordinates(N, size, size)).long()
    flipped = out[:, 1, 4, 4] < out[:, 1, 4, 3]  # columns 3 and 4 are never padding
    # The centre pixel is never padding here: it tells the window's offset on the padded canvas.
    top = out[:, 0, 4, 4] - 1 - 4 + pad
    left = torch.where(flipped, out[:, 1, 4, 4] - 1 - 3, out[:, 1, 4, 4] - 1 - 4) + pad
    # The per-image op draws offsets uniformly from the same range.
    rng = np.random.default_rng(0)
    ref = np.array([RandomPadCrop(pad, size=(size, size)).get_params((size, size), rng) for _ in range(2000)])
    assert set(ref[:, 0]) == set(top.tolist()) == set(left.tolist()) == set(range(2 * pad + 1))
    bound = 5 * np.sqrt((1 / 7) * (6 / 7) / N)
    for offsets in (top, left):
        assert np.abs(_frequencies(offsets, 2 * pad + 1) - 1 / (2 * pad + 1)).max() < bound
    assert abs(flipped.float().mean().item() - p) < 5 * np.sqrt(p * (1 - p) / N)
    # Independent draws: the flip rate does not depend on the offset.
    assert abs(flipped[top == 0].float().mean().item() - p) < 5 * np.sqrt(p * (1 - p) / (N / 7))
    # Along a row, the columns count down in a flipped image and up otherwise; zero padding outside.
    cols = out[:, 1]
    step = cols[:, :, 1:] - cols[:, :, :-1]
    both = (cols[:, :, 1:] > 0) & (cols[:, :, :-1] > 0)
    expected = torch.where(flipped, -1, 1).view(-1, 1, 1).expand_as(step)
    assert torch.equal(step[both], expected[both])
    inside = (out[:, 0] > 0) & (out[:, 1] > 0)
    assert torch.equal(out[:, 2][inside], torch.full_like(out[:, 2][inside], 7))
    assert int(out[:, 2][~inside].max()) == 0


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
@pytest.mark.parametrize("width", [1, 3, 7])
def test_each_output_is_a_window_of_np_pad_in_every_padding_mode(mode, width):
    pad, height = 5, 4  # padding wider than the image: reflect / symmetric mirror repeatedly
    images = torch.randint(0, 256, (40, 3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    out = BatchAugmentation("cpu", seed=0, pad_crop=RandomPadCrop(pad, mode=mode),
                            flip=RandomHorizontalFlip(0.5)).apply(images)
    for img, got in zip(images.numpy(), out.numpy()):
        canvas = np.pad(img, ((0, 0), (pad, pad), (pad, pad)), mode=mode)
        windows = [canvas[:, t:t + height, left:left + width] for t in range(2 * pad + 1)
                   for left in range(2 * pad + 1)]
        assert any(np.array_equal(w, got) or np.array_equal(w[:, :, ::-1], got) for w in windows)


def _erased_rectangles(out: torch.Tensor, fill: torch.Tensor):
    """(erased, h, w, top, left) of each image of a batch that was all zeros before erasing."""
    mask = (out == fill.view(1, 3, 1, 1)).all(dim=1)
    rows, cols = mask.any(dim=2), mask.any(dim=1)
    h, w = rows.sum(1), cols.sum(1)
    return h > 0, h, w, rows.int().argmax(1), cols.int().argmax(1)


def test_random_erasing_matches_the_per_image_op_in_rate_size_place_and_fill():
    height, width = 16, 8
    op = RandomErasing(p=0.6, scale=(0.02, 0.4), ratio=(0.3, 3.3), value=(10.4, 20.6, 250.0))
    out = BatchAugmentation("cpu", seed=0, erasing=op).apply(torch.zeros(N, 3, height, width, dtype=torch.uint8))
    fill = torch.tensor([10, 21, 250], dtype=torch.uint8)
    erased, h, w, top, left = _erased_rectangles(out, fill)
    # Exactly one filled rectangle per erased image, the rest untouched.
    assert torch.equal(out.sum(dim=(1, 2, 3)), (h * w * int(fill.long().sum())).to(out.sum(dim=(1, 2, 3)).dtype))
    rng = np.random.default_rng(0)
    ref = [op.get_params(height, width, rng) for _ in range(N)]
    ref_erased = np.array([r is not None for r in ref])
    ref = np.array([r for r in ref if r is not None])  # (top, left, h, w)
    rate = ref_erased.mean()
    assert abs(erased.float().mean().item() - rate) < 5 * np.sqrt(2 * rate * (1 - rate) / N)
    # Marginal distributions of the rectangle: total variation distance between the two samples.
    for got, want, count in ((h[erased], ref[:, 2], height), (w[erased], ref[:, 3], width),
                             (top[erased], ref[:, 0], height), (left[erased], ref[:, 1], width)):
        tv = 0.5 * np.abs(_frequencies(got, count) - np.bincount(want, minlength=count) / len(want)).sum()
        assert tv < 0.03, (count, tv)
    area = (h * w)[erased].float() / (height * width)
    assert area.min() >= 0.02 and area.max() <= 0.4
    assert abs(area.mean().item() - (ref[:, 2] * ref[:, 3]).mean() / (height * width)) < 0.01
    # The placement is uniform given the size: no rectangle leaves the image.
    assert bool(((top + h)[erased] <= height).all()) and bool(((left + w)[erased] <= width).all())


def test_erasing_gives_up_like_the_per_image_op_when_nothing_fits():
    op = RandomErasing(p=1.0, scale=(0.5, 0.9), ratio=(10.0, 20.0))  # too tall for a 4 x 4 image
    out = BatchAugmentation("cpu", seed=0, erasing=op).apply(torch.zeros(64, 3, 4, 4, dtype=torch.uint8))
    assert op.get_params(4, 4, np.random.default_rng(0)) is None
    assert int(out.max()) == 0


def test_same_seed_same_batch_and_state_dict_round_trip_continues_the_stream():
    def make(seed):
        return BatchAugmentation("cpu", seed, flip=RandomHorizontalFlip(), pad_crop=RandomPadCrop(2),
                                 erasing=RandomErasing(p=0.5))

    images = torch.randint(0, 256, (16, 3, 12, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    first, second = make(3), make(3)
    assert torch.equal(first.apply(images), second.apply(images))
    assert not torch.equal(make(4).apply(images), make(3).apply(images))
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # as in a checkpoint, loaded without pickle
    buffer.seek(0)
    expected = first.apply(images)
    state = torch.load(buffer, weights_only=True)
    resumed, other_rank = make(3), make(99)
    resumed.load_state_dict(state)
    other_rank.load_state_dict(state)  # what every rank loads: the main process's state
    assert torch.equal(resumed.apply(images), expected)
    assert not torch.equal(other_rank.apply(images), expected)  # each rank keeps drawing its own
    # The input is not modified; the batch dict keeps its other entries.
    before = images.clone()
    batch = resumed({"images": images, "targets": torch.arange(16)})
    assert torch.equal(images, before) and torch.equal(batch["targets"], torch.arange(16))


def test_tracklets_draw_once_per_tracklet_like_the_per_image_path():
    frame = torch.randint(0, 256, (3, 10, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    tracklets = frame.expand(32, 4, 3, 10, 6).contiguous()
    augment = BatchAugmentation("cpu", 0, flip=RandomHorizontalFlip(), pad_crop=RandomPadCrop(3),
                                erasing=RandomErasing(p=1.0))
    out = augment.apply(tracklets)
    assert out.shape == tracklets.shape
    assert all(torch.equal(out[:, t], out[:, 0]) for t in range(1, 4))  # frames of one tracklet alike
    assert len({out[b, 0].numpy().tobytes() for b in range(32)}) > 16  # tracklets drawn apart


def _cfg(**opts):
    cfg = get_cfg()
    base = {"INPUT.SIZE_TRAIN": [16, 8], "INPUT.FLIP.ENABLED": True, "INPUT.PADDING.ENABLED": True,
            "INPUT.REA.ENABLED": True, "MODEL.DEVICE": "cpu"}
    cfg.merge_from_list([x for kv in {**base, **opts}.items() for x in kv])
    return cfg


def test_pipeline_drops_exactly_the_moved_ops_and_auto_is_off_on_the_cpu():
    names = [type(op).__name__ for op in build_transforms(_cfg(**{"INPUT.CJ.ENABLED": True})).sample_ops]
    assert names == ["Resize", "RandomPadCrop", "RandomHorizontalFlip", "RandomApply", "RandomErasing"]
    moved = build_transforms(_cfg(**{"INPUT.CJ.ENABLED": True, "INPUT.DEVICE_AUGMENT": "on"}))
    assert [type(op).__name__ for op in moved.sample_ops] == ["Resize", "RandomApply"]
    assert not device_augment_enabled(_cfg())  # auto on the CPU: per image
    assert device_augment_enabled(_cfg(), "cuda") and device_augment_enabled(_cfg(**{"MODEL.DEVICE": "cuda:0"}))
    assert not device_augment_enabled(_cfg(**{"INPUT.CJ.ENABLED": True}), "cuda")  # would reorder CJ
    assert not device_augment_enabled(_cfg(**{"INPUT.DEVICE_AUGMENT": "off"}), "cuda")
    plain = _cfg(**{"INPUT.FLIP.ENABLED": False, "INPUT.PADDING.ENABLED": False, "INPUT.REA.ENABLED": False,
                    "INPUT.DEVICE_AUGMENT": "on"})
    assert not device_augment_enabled(plain) and build_batch_augmentation(plain, "cpu", 0) is None
    with pytest.raises(UnknownChoiceError, match=r"^unknown INPUT.DEVICE_AUGMENT 'yes': choose one of auto, on, off"):
        build_transforms(_cfg(**{"INPUT.DEVICE_AUGMENT": "yes"}))


def test_builder_takes_the_config_values_and_says_where_the_ops_run(caplog):
    opts = {"INPUT.FLIP.PROB": 0.25, "INPUT.PADDING.SIZE": 3, "INPUT.PADDING.MODE": "edge", "INPUT.REA.PROB": 0.7,
            "INPUT.REA.SCALE": [0.1, 0.2], "INPUT.REA.RATIO": [0.5, 2.0], "INPUT.REA.VALUE": [1.0, 2.0, 3.0]}
    with caplog.at_level(logging.INFO, logger="reid_engine"):
        assert build_batch_augmentation(_cfg(**opts), "cpu", seed=0) is None
        augment = build_batch_augmentation(_cfg(**opts, **{"INPUT.DEVICE_AUGMENT": "on"}), "cpu", seed=0)
    assert "pad-crop, flip, erasing per image in the loader workers (INPUT.DEVICE_AUGMENT auto: on cpu" in caplog.text
    assert "pad-crop, flip, erasing batched on cpu" in caplog.text
    assert augment.flip.p == 0.25 and (augment.pad_crop.padding, augment.pad_crop.mode) == (3, "edge")
    assert (augment.erasing.p, augment.erasing.scale, augment.erasing.ratio) == (0.7, (0.1, 0.2), (0.5, 2.0))
    assert augment.erasing.value == [1.0, 2.0, 3.0]
    # Ranks and stream seeds draw apart.
    cfg = _cfg(**{"INPUT.DEVICE_AUGMENT": "on"})
    states = {build_batch_augmentation(cfg, "cpu", s, rank=r).seed for s, r in ((0, 0), (0, 1), (1, 0))}
    assert len(states) == 3


class _ImageModel(nn.Module):
    """A linear classifier over the raw pixels of a (B, 3, 8, 4) uint8 batch."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(96, 3)

    def forward(self, batch):
        x = batch["images"].float().flatten(1) / 255
        return {"loss": nn.functional.cross_entropy(self.fc(x), batch["targets"])}


class _Stream:
    """A checkpointable stream of fixed image batches."""

    def __init__(self):
        self.position = 0

    def __iter__(self):
        while True:
            g = torch.Generator().manual_seed(self.position)
            self.position += 1
            yield {"images": torch.randint(0, 256, (8, 3, 8, 4), dtype=torch.uint8, generator=g),
                   "targets": torch.randint(0, 3, (8,), generator=g)}

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def _trainer():
    torch.manual_seed(0)
    model = _ImageModel()
    augment = BatchAugmentation("cpu", 5, flip=RandomHorizontalFlip(), pad_crop=RandomPadCrop(2),
                                erasing=RandomErasing(p=0.5))
    return SimpleTrainer(model, _Stream(), torch.optim.SGD(model.parameters(), lr=0.5), batch_augment=augment)


def test_trainer_applies_the_batch_augmentation_and_resumes_it_exactly():
    straight = _trainer()
    straight.train(0, 6)
    first = _trainer()
    first.train(0, 3)
    first.iter = 2  # as saved by a checkpoint hook in after_step of iteration 2
    buffer = io.BytesIO()
    torch.save({"model": first.model.state_dict(), "trainer": first.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    assert set(checkpoint["trainer"]["batch_augment"]) == {"steps", "device_type"}
    resumed = _trainer()
    resumed.model.load_state_dict(checkpoint["model"])
    resumed.load_state_dict(checkpoint["trainer"])
    resumed.train(3, 6)
    assert torch.equal(resumed.model.fc.weight, straight.model.fc.weight)
    # Without the augmentation state the run differs: the state is what made it exact.
    fresh = _trainer()
    fresh.model.load_state_dict(checkpoint["model"])
    fresh.load_state_dict({k: v for k, v in checkpoint["trainer"].items() if k != "batch_augment"})
    fresh.train(3, 6)
    assert not torch.equal(fresh.model.fc.weight, straight.model.fc.weight)


class HostReads(TorchFunctionMode):
    """Records the calls that would make the host wait for a GPU: a read of values (``item``,
    ``bool``, ``tolist``, ``cpu`` ...) or an output whose size depends on them (``nonzero``, a
    boolean mask index). On the CPU they cost nothing, so this stands in for CUDA's sync debug mode."""

    SYNCING = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero",
               "argwhere", "masked_select", "unique", "unique_consecutive", "equal", "allclose"}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name == "__getitem__" else None
        masks = [i for i in (index if isinstance(index, tuple) else (index,))
                 if isinstance(i, torch.Tensor) and i.dtype == torch.bool]
        repeats = args[1] if name == "repeat_interleave" and len(args) > 1 else None
        if name in self.SYNCING or masks or (isinstance(repeats, torch.Tensor) and "output_size" not in (kwargs or {})):
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def test_the_draws_read_nothing_back_to_the_host():
    """The device-independent half of the CUDA test below: no op of the batched augmentation
    reads device values on the host (each would stall the GPU's queue every step)."""
    images = torch.randint(0, 256, (16, 3, 32, 16), dtype=torch.uint8)
    with HostReads() as check:
        torch.ones(2).sum().item()  # the check sees a read
        assert check.reads == ["item"]
        check.reads.clear()
        for mode in ("constant", "edge"):
            augment = BatchAugmentation("cpu", 0, flip=RandomHorizontalFlip(), pad_crop=RandomPadCrop(2, mode=mode),
                                        erasing=RandomErasing(p=0.5))
            augment({"images": images})
            augment.apply(images.view(4, 4, 3, 32, 16))  # tracklets: one draw per tracklet
    assert check.reads == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a CUDA generator, CUDA's sync debug mode)")
def test_on_cuda_the_draws_stay_on_the_device_without_host_sync_and_resume_exactly():
    def make(seed):
        # an indexed device, as the trainer passes it (the model's): "cuda" would not equal the batch's cuda:0
        return BatchAugmentation("cuda:0", seed, flip=RandomHorizontalFlip(), pad_crop=RandomPadCrop(2),
                                 erasing=RandomErasing(p=0.5))

    augment = make(0)
    batch = {"images": torch.randint(0, 256, (64, 3, 32, 16), dtype=torch.uint8).pin_memory()}
    augment(batch)  # warm-up (allocations, kernels)
    state = augment.state_dict()
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        out = augment(batch)["images"]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.device.type == "cuda" and out.shape == batch["images"].shape
    again = make(0)
    again.load_state_dict(state)
    assert torch.equal(again.apply(batch["images"].cuda()), out)


def _default_trainer(out_dir, data_root, max_iter):
    """A tiny BoT DefaultTrainer with the batched path on, stopping after ``max_iter`` steps."""
    import os

    from reid_engine.engine.defaults import DefaultTrainer
    from reid_engine.utils.env import seed_all_rng
    from tests.conftest import REPO_ROOT

    class NoEvalTrainer(DefaultTrainer):
        @classmethod
        def test(cls, cfg, model, evaluators=None, final=False):
            return {}

    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO_ROOT, "tests", "e2e", "configs", "tiny_R18.yml"))
    cfg.merge_from_list(["DATASETS.ROOT", data_root, "OUTPUT_DIR", out_dir, "INPUT.DEVICE_AUGMENT", "on",
                         "INPUT.SIZE_TRAIN", [32, 16], "SOLVER.IMS_PER_BATCH", 8, "DATALOADER.NUM_INSTANCE", 2,
                         "SOLVER.WARMUP_ITERS", 1, "MODEL.BACKBONE.WIDTH_MULT", 0.25])
    seed_all_rng(cfg.SEED)  # as default_setup: every run starts from the same weights
    trainer = NoEvalTrainer(cfg)
    trainer.max_iter = max_iter  # the last step writes model_final.pth with the whole trainer state
    return trainer


@pytest.mark.slow
def test_default_trainer_resume_with_the_batched_path_is_exact(data_root, tmp_path):
    logging.getLogger("reid_engine").setLevel(logging.INFO)  # else DefaultTrainer sets up logging
    steps = 4
    straight = _default_trainer(str(tmp_path / "straight"), data_root, steps)
    assert isinstance(straight._trainer.batch_augment, BatchAugmentation)
    assert [type(op).__name__ for op in straight.data_loader.dataset.transform.sample_ops] == ["Resize"]
    straight.resume_or_load(resume=False)
    straight.train()
    first = _default_trainer(str(tmp_path / "resumed"), data_root, steps // 2)
    first.resume_or_load(resume=False)
    first.train()
    assert "batch_augment" in first.state_dict()["_trainer"]
    resumed = _default_trainer(str(tmp_path / "resumed"), data_root, steps)
    resumed.resume_or_load(resume=True)  # from the first half's model_final.pth
    assert resumed.start_iter == steps // 2
    resumed.train()
    assert resumed._trainer.batch_augment.steps == straight._trainer.batch_augment.steps == steps
    expected, got = straight.model.state_dict(), resumed.model.state_dict()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def test_precise_bn_loader_keeps_the_ops_per_image(data_root):
    """PreciseBN feeds its loader's batches to the model as they come: no batched ops there."""
    from reid_engine.engine.defaults import DefaultTrainer

    cfg = _cfg(**{"INPUT.DEVICE_AUGMENT": "on", "DATASETS.ROOT": data_root, "TEST.PRECISE_BN.DATASET": "SyntheticReIDTiny",
                  "DATALOADER.NUM_WORKERS": 0, "SOLVER.IMS_PER_BATCH": 8})
    names = [type(op).__name__ for op in DefaultTrainer.build_precise_bn_loader(cfg).dataset.transform.sample_ops]
    assert names == ["Resize", "RandomPadCrop", "RandomHorizontalFlip", "RandomErasing"]
