"""What the benchmark scripts time with: calls, interleaved rounds, a block's wall and CPU seconds, a
trainer's steps, and the trainer without its final evaluation.

One way of timing for every script, so that their figures mean the same thing: wall seconds of
``time.perf_counter`` (``time.process_time`` where a script asks for CPU seconds), a CUDA device
synchronised at the ends of what is timed. ``torch.utils.benchmark.Timer`` is not used: it runs
one thread unless told otherwise and times blocks of calls it sizes itself, while these scripts
compare whole calls of different things in rounds that take turns on a shared machine.
"""
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from reid_engine.engine import DefaultTrainer, HookBase

__all__ = ["Stopwatch", "StepTimer", "TrainOnly", "interleaved", "synchronize", "timed"]


def synchronize(device: Optional[torch.device] = None) -> None:
    """Wait for a CUDA device's queued work (nothing on another device)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], repeats: int = 1, warmup: int = 0, device: Optional[torch.device] = None,
          each: Optional[Callable[[int, float], None]] = None) -> Tuple[List[float], Any]:
    """Time `repeats` calls of `fn` after `warmup` untimed ones.

    Args:
        device: a CUDA device is synchronised before and after each call.
        each: called with (call index, seconds) after every call, warm-up ones included (progress).
    Returns:
        (the seconds of each timed call, the last call's result).
    """
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


def interleaved(fns: Dict[str, Callable[[], Any]], rounds: int, calls: int = 1, warmup: int = 0, rotate: bool = False,
                device: Optional[torch.device] = None) -> Dict[str, List[float]]:
    """Seconds of `calls` calls of each function, round after round.

    Each round runs every function's calls once, so that a slower moment of a shared machine
    hits all of them alike; with `rotate` the order shifts by one each round (the first place
    of a round is then no function's for good). Every function first runs `warmup` untimed calls.

    Returns:
        {name: [seconds of its calls in each round]}.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    def repeated(fn):
        for _ in range(calls):
            fn()

    names, samples = list(fns), {name: [] for name in fns}
    for index in range(rounds):
        shift = index % len(names) if rotate else 0
        for name in names[shift:] + names[:shift]:
            samples[name] += timed(lambda: repeated(fns[name]), device=device)[0]
    return samples


class Stopwatch:
    """The wall and CPU seconds (this process, all its threads) of a block.

        with Stopwatch() as watch:
            work()
        print(watch.wall, watch.cpu)
    """

    wall = cpu = float("nan")

    def __enter__(self) -> "Stopwatch":
        self._start = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self._start[0], time.process_time() - self._start[1]


class StepTimer(HookBase):
    """Times a trainer's loop with `clock` (wall seconds by default).

    - ``steps``: each step, before_step to after_step;
    - ``iterations``: each loop iteration, from one before_step to the next (every hook
      included), less the time spent inside :meth:`excluded` blocks;
    - ``window`` and ``peak_gb``: from iteration `start` to the end of training, with one device
      synchronisation at each end (never per step), and the CUDA memory peak in that window.
    """

    def __init__(self, start: int = 0, device: Optional[torch.device] = None, clock: Callable[[], float] = time.perf_counter):
        self.start, self.device, self.clock = start, torch.device(device or "cpu"), clock
        self.steps: List[float] = []
        self.iterations: List[float] = []
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

    def excluded(self) -> "_Excluded":
        """A block whose time does not count in the loop iteration it runs in."""
        return _Excluded(self)


class _Excluded:
    def __init__(self, timer: StepTimer):
        self.timer = timer

    def __enter__(self):
        self._start = self.timer.clock()

    def __exit__(self, *exc):
        self.timer._excluded += self.timer.clock() - self._start


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
