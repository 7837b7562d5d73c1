"""What the benchmark scripts time and set up with: calls, interleaved rounds, a block's wall and CPU
seconds, a trainer's steps, the trainer without its final evaluation; a BoT config, a random batch, a
training step on it, the peak memory, a markdown table and the command line that printed it.

One way of timing, so that the scripts' figures mean the same thing: wall seconds of ``time.perf_counter``
(``time.process_time`` for CPU seconds), a CUDA device synchronised at the ends of what is timed. Not
``torch.utils.benchmark.Timer``: it runs one thread unless told otherwise and times blocks of calls it
sizes itself, while these scripts compare whole calls of different things in turns on a shared machine.
"""
import contextlib
import os
import resource
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from reid_engine.config import get_cfg
from reid_engine.engine import DefaultTrainer, HookBase

__all__ = ["REPO", "Stopwatch", "StepTimer", "TrainOnly", "bot_config", "interleaved", "medians", "peak_rss_gb",
           "print_command", "print_table", "random_batch", "in_rounds", "synchronize", "timed", "train_step"]

#: the checkout the scripts belong to (their configs, tools/train_net.py, datasets/)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def synchronize(device: Optional[torch.device] = None) -> None:
    """Wait for a CUDA device's queued work (nothing on another device)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], repeats: int = 1, warmup: int = 0, device: Optional[torch.device] = None,
          each: Optional[Callable[[int, float], None]] = None) -> Tuple[List[float], Any]:
    """Time `repeats` calls of `fn` after `warmup` untimed ones, a CUDA `device` synchronised around each;
    `each(index, seconds)` after every call (progress). Returns (seconds of each timed call, last result)."""
    times, result = [], None
    for index in range(warmup + repeats):
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        seconds = time.perf_counter() - start
        if each is not None:
            each(index, seconds)
        if index >= warmup:
            times.append(seconds)
    return times, result


def in_rounds(fns: Dict[Any, Callable[[], Any]], count: int, rotate: bool = False) -> Dict[Any, List[Any]]:
    """What each function returns, round after round: {name: [its result in each round]}. A round calls every
    function once, so that a slower moment hits all alike; `rotate` shifts the order by one each round."""
    names, results = list(fns), {name: [] for name in fns}
    for index in range(count):
        shift = index % len(names) if rotate else 0
        for name in names[shift:] + names[:shift]:
            results[name].append(fns[name]())
    return results


def interleaved(fns: Dict[str, Callable[[], Any]], rounds: int, calls: int = 1, warmup: int = 0, rotate: bool = False,
                device: Optional[torch.device] = None) -> Dict[str, List[float]]:
    """Seconds of `calls` calls of each function in each of `rounds` :func:`in_rounds`, after
    `warmup` untimed calls of each: {name: [seconds of its calls in each round]}."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()

    def repeated(fn):
        for _ in range(calls):
            fn()
    return in_rounds({name: lambda fn=fn: timed(lambda: repeated(fn), device=device)[0][0] for name, fn in fns.items()},
                     rounds, rotate)


def medians(samples: Sequence) -> Any:
    """The median of numbers; of tuples or dicts of numbers, the median of each place or key."""
    if isinstance(samples[0], dict):
        return {key: statistics.median(s[key] for s in samples) for key in samples[0]}
    if isinstance(samples[0], tuple):
        return tuple(statistics.median(column) for column in zip(*samples))
    return statistics.median(samples)


class Stopwatch:
    """The wall and CPU seconds (this process, all its threads) of a ``with`` block: ``watch.wall``, ``watch.cpu``."""

    wall = cpu = float("nan")

    def __enter__(self) -> "Stopwatch":
        self._start = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self._start[0], time.process_time() - self._start[1]


class StepTimer(HookBase):
    """Times a trainer's loop with `clock` (wall seconds by default): ``steps``, each step; ``iterations``,
    before_step to before_step (hooks included) less :meth:`excluded` blocks; ``window`` and ``peak_gb``,
    iteration `start` to the end, synchronised at both ends only, and the CUDA memory peak in it."""

    def __init__(self, start: int = 0, device: Optional[torch.device] = None, clock: Callable[[], float] = time.perf_counter):
        self.start, self.device, self.clock = start, torch.device(device or "cpu"), clock
        self.steps: List[float] = []  # seconds of each step
        self.iterations: List[float] = []  # seconds of each loop iteration
        self.window = self.peak_gb = float("nan")
        self._window_start = self._step_start = self._last = None
        self._excluded = 0.0

    def before_step(self):
        if self.trainer.iter == self.start:
            synchronize(self.device)
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            self._window_start = self.clock()
        now = self.clock()
        if self._last is not None:
            self.iterations.append(now - self._last - self._excluded)
        self._last, self._excluded, self._step_start = now, 0.0, now

    def after_step(self):
        self.steps.append(self.clock() - self._step_start)

    def after_train(self):
        synchronize(self.device)
        if self._window_start is not None:
            self.window = self.clock() - self._window_start
        if self.device.type == "cuda":
            self.peak_gb = torch.cuda.max_memory_allocated(self.device) / 1e9

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """A block whose time does not count in the loop iteration it runs in."""
        start = self.clock()
        try:
            yield
        finally:
            self._excluded += self.clock() - start


class TrainOnly(DefaultTrainer):
    """The DefaultTrainer for `max_iter` iterations (default: the config's), `hooks` added after its
    own, and without its final evaluation (not part of the training loop)."""

    def __init__(self, cfg, max_iter: Optional[int] = None, hooks: Sequence[HookBase] = ()):
        self._extra_hooks = list(hooks)
        super().__init__(cfg)
        if max_iter is not None:
            self.max_iter = max_iter

    def build_hooks(self):
        """The default hooks, then the benchmark's."""
        return super().build_hooks() + self._extra_hooks

    @classmethod
    def test(cls, cfg, model, evaluators=None, final=False):
        """No evaluation."""
        return {}


def bot_config(depth: str = "50x", size: Sequence[int] = (256, 128), device: str = "cpu", num_classes: int = 751,
               backbone: str = "build_resnet_backbone"):
    """The BoT model's config (BNNeck, CE with label smoothing 0.1, hard-mining triplet 0.3) on
    `backbone` (MODEL.BACKBONE.NAME) of `depth`, at input `size` (H, W), without ImageNet weights."""
    cfg = get_cfg()
    cfg.merge_from_list(["MODEL.DEVICE", device, "MODEL.BACKBONE.NAME", backbone, "MODEL.BACKBONE.DEPTH", depth,
                         "MODEL.BACKBONE.PRETRAIN", False, "MODEL.HEADS.WITH_BNNECK", True,
                         "MODEL.HEADS.NUM_CLASSES", num_classes, "MODEL.LOSSES.NAME", ("CrossEntropyLoss", "TripletLoss"),
                         "MODEL.LOSSES.CE.EPSILON", 0.1, "MODEL.LOSSES.TRI.HARD_MINING", True,
                         "MODEL.LOSSES.TRI.MARGIN", 0.3, "INPUT.SIZE_TRAIN", list(size), "INPUT.SIZE_TEST", list(size)])
    return cfg


def random_batch(batch: int, instances: int, height: int, width: int, device: torch.device = torch.device("cpu")):
    """Random uint8 images (seeded) of batch // instances identities of `instances` images each."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, 3, height, width), dtype=torch.uint8, generator=gen)
    targets = torch.arange(batch // instances).repeat_interleave(instances)
    return {"images": images.to(device), "targets": targets.to(device)}


def train_step(model, optimizer, batch, amp_dtype: Optional[torch.dtype] = None, scaler=None,
               before: Optional[Callable[[], None]] = None) -> Callable[[], None]:
    """One training step on a fixed batch, as a callable: (`before`), forward under autocast to
    `amp_dtype` (none: fp32) on the model's device, the summed losses backward (through the fp16
    GradScaler `scaler` when given), the optimizer's step."""
    device_type = next(model.parameters()).device.type

    def step():
        if before is not None:
            before()
        with torch.autocast(device_type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = sum(model(batch).values())
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    return step


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far, in GB (ru_maxrss is in KB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2


def print_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> None:
    """A markdown table of already formatted cells; `align` has one letter a column ("r": right-aligned)."""
    print("| " + " | ".join(header) + " |")
    print("|" + "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header), "l")))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def print_command(script: str, argv: Optional[Sequence[str]]) -> None:
    """The line that reruns a script (`script`: its __file__) with `argv` (None: this process's)."""
    words = sys.argv[1:] if argv is None else argv
    print(f"command: python tools/benchmarks/{os.path.basename(script)} " + " ".join(words))
