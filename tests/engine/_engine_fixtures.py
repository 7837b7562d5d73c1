"""Tiny models, data streams and trainers shared by the engine tests (CPU, milliseconds)."""
import contextlib
import logging
import os
from typing import Dict, Iterator, List

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reid_engine.config import get_cfg
from reid_engine.engine.train_loop import HookBase, SimpleTrainer, TrainerBase
from reid_engine.evaluation.evaluator import DatasetEvaluator

#: the tiny ResNet-18 BoT config of the end-to-end tests
TINY_CONFIG = os.path.join(os.path.dirname(__file__), "..", "e2e", "configs", "tiny_R18.yml")


@pytest.fixture
def info_logging():
    """DefaultTrainer runs setup_logger when INFO is off; tests/conftest.py restores the logger."""
    logging.getLogger("reid_engine").setLevel(logging.INFO)


def tiny_trainer_cfg(data_root: str, out, *opts):
    """The tiny config on the synthetic test set at 32x16, no test sets, writing into `out`; `opts` override."""
    cfg = get_cfg()
    cfg.merge_from_file(TINY_CONFIG)
    cfg.merge_from_list(["DATASETS.ROOT", data_root, "OUTPUT_DIR", str(out), "DATASETS.TESTS", "()",
                         "INPUT.SIZE_TRAIN", "[32, 16]", "INPUT.SIZE_TEST", "[32, 16]", *opts])
    return cfg


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny ops run fastest on one thread (several threads spin badly on a busy machine);
    imported by the test modules, restored after each module."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def short_compile_comparison(monkeypatch, tmp_path):
    """A compile record file of the test's own, a short CompileGuard comparison (2 eager steps,
    then 1 compiling and 2 timed compiled steps) and a clean dynamo before and after."""
    import torch._dynamo

    from reid_engine.runtime import compile_guard

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compile_guard, "EAGER_STEPS", 2)
    monkeypatch.setattr(compile_guard, "COMPILE_WARMUP_STEPS", 1)
    monkeypatch.setattr(compile_guard, "TIMED_STEPS", 2)
    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()
    yield
    torch._dynamo.reset()


class Clock:
    """A fake timer for CompileGuard: each call advances by `step` seconds (a timed step then takes `step`)."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step  # start and end of a timed step: `step` apart
        return self.now


class TinyModel(nn.Module):
    """A linear -> BN -> linear classifier on 4-d inputs returning a dict of losses."""

    def __init__(self, num_losses: int = 2, with_bn: bool = True):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8) if with_bn else nn.Identity(), nn.ReLU())
        self.head = nn.Linear(8, 3)
        self.num_losses = num_losses
        self.last_dtype = None

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        logits = self.head(self.backbone(batch["x"]))
        self.last_dtype = logits.dtype
        losses = {"loss_cls": F.cross_entropy(logits.float(), batch["y"])}
        if self.num_losses > 1:
            losses["loss_reg"] = 0.1 * logits.float().pow(2).mean()
        return losses


def make_batch(index: int, batch_size: int = 8) -> Dict[str, torch.Tensor]:
    """The ``index``-th batch of a deterministic stream (independent of global RNGs)."""
    g = torch.Generator().manual_seed(1000 + index)
    return {"x": torch.randn(batch_size, 4, generator=g) + 2.0, "y": torch.randint(0, 3, (batch_size,), generator=g)}


class ResumableStream:
    """An infinite, checkpointable batch stream: ``state_dict`` holds the position."""

    def __init__(self):
        self.position = 0

    def __iter__(self):
        while True:
            batch = make_batch(self.position)
            self.position += 1
            yield batch

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


def make_trainer(num_losses: int = 2, with_bn: bool = True, lr: float = 0.1, trainer_cls=SimpleTrainer, **kwargs):
    """A SimpleTrainer (or subclass) over TinyModel, ResumableStream and SGD with momentum."""
    torch.manual_seed(0)
    model = TinyModel(num_losses=num_losses, with_bn=with_bn)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    return trainer_cls(model, ResumableStream(), optimizer, **kwargs)


class NoOpTrainer(TrainerBase):
    """A trainer whose steps do nothing: for testing hook scheduling cheaply."""

    def run_step(self) -> None:
        pass


class RecordingHook(HookBase):
    """Records (phase, trainer.iter, storage.iter) for every call."""

    def __init__(self):
        self.calls: List[tuple] = []

    def _record(self, phase: str) -> None:
        storage = self.trainer.storage
        self.calls.append((phase, self.trainer.iter, storage.iter if storage is not None else None))

    def before_train(self):
        self._record("before_train")

    def after_train(self):
        self._record("after_train")

    def before_step(self):
        self._record("before_step")

    def after_backward(self):
        self._record("after_backward")

    def after_step(self):
        self._record("after_step")


class ListHandler(logging.Handler):
    """Collects formatted messages."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def capture_logs(name: str = "reid_engine") -> Iterator[ListHandler]:
    """Collect the INFO+ messages of logger ``name`` (whatever its propagation) while open."""
    handler = ListHandler()
    logger = logging.getLogger(name)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if old_level in (logging.NOTSET,) or old_level > logging.INFO else old_level)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


class CollectFeatures(DatasetEvaluator):
    """A DatasetEvaluator that keeps every batch's outputs until the end, as the ReID evaluator does;
    ``evaluate()`` returns {"features": all of them}."""

    def reset(self):
        self.features = []

    def process(self, inputs, outputs):
        self.features.append(outputs)

    def evaluate(self):
        return {"features": torch.cat(self.features)}
