"""Diagnostics hooks: the torch profiler and CUDA memory statistics."""
import logging
import os
import shutil
import time
from typing import Callable

import torch

from ...utils import comm
from ..train_loop import HookBase

logger = logging.getLogger(__name__)


class TorchProfiler(HookBase):
    """Profile the steps ``enable_predicate(trainer)`` selects with torch.profiler and
    write ``profiler-trace-iter{N}.json`` chrome traces (and tensorboard traces under
    ``log/profiler-tensorboard-iter{N}``) into ``output_dir``."""

    def __init__(self, enable_predicate: Callable, output_dir: str, *, activities=None,
                 save_tensorboard: bool = True):
        """
        Args:
            enable_predicate: ``f(trainer) -> bool``, checked before each step.
            output_dir: where traces are written.
            activities: torch.profiler activities (default: CPU, plus CUDA when available).
            save_tensorboard: also write a tensorboard trace.
        """
        self._enable_predicate = enable_predicate
        self._output_dir = output_dir
        if activities is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._activities = activities
        self._save_tensorboard = save_tensorboard
        self._profiler = None

    def before_step(self):
        if not self._enable_predicate(self.trainer):
            self._profiler = None
            return
        self._profiler = torch.profiler.profile(activities=self._activities, record_shapes=True,
                                                profile_memory=True, with_stack=True)
        self._profiler.__enter__()

    def after_step(self):
        if self._profiler is None:
            return
        self._profiler.__exit__(None, None, None)
        os.makedirs(self._output_dir, exist_ok=True)
        path = os.path.join(self._output_dir, f"profiler-trace-iter{self.trainer.iter}.json")
        self._profiler.export_chrome_trace(path)
        if self._save_tensorboard:
            # A trace can be exported once: copy it where the tensorboard plugin looks,
            # named <worker>.<id>.pt.trace.json as torch.profiler.tensorboard_trace_handler does.
            tb_dir = os.path.join(self._output_dir, "log", f"profiler-tensorboard-iter{self.trainer.iter}")
            os.makedirs(tb_dir, exist_ok=True)
            tb_name = f"worker{comm.get_rank()}.{time.time_ns()}.pt.trace.json"
            shutil.copyfile(path, os.path.join(tb_dir, tb_name))
        logger.info(f"Wrote the profiler trace of iteration {self.trainer.iter} to {path}")
        self._profiler = None

    def after_train(self):
        if self._profiler is not None:  # a profiled step raised
            self._profiler.__exit__(None, None, None)
            self._profiler = None


class TorchMemoryStats(HookBase):
    """Log CUDA memory statistics every ``period`` iterations, at most ``max_runs``
    times (the last time with the full ``torch.cuda.memory_summary()``). No-op without
    CUDA."""

    def __init__(self, period: int = 20, max_runs: int = 10):
        """
        Args:
            period: iterations between reports.
            max_runs: maximum number of reports.
        """
        self._period = period
        self._max_runs = max_runs
        self._runs = 0

    def after_step(self):
        if self._runs >= self._max_runs or not torch.cuda.is_available():
            return
        if (self.trainer.iter + 1) % self._period == 0 or self.trainer.iter == self.trainer.max_iter - 1:
            mb = 1024.0 * 1024.0
            logger.info(
                f"iter: {self.trainer.iter}  max_reserved_mem: {torch.cuda.max_memory_reserved() / mb:.0f}MB  "
                f"reserved_mem: {torch.cuda.memory_reserved() / mb:.0f}MB  "
                f"max_allocated_mem: {torch.cuda.max_memory_allocated() / mb:.0f}MB  "
                f"allocated_mem: {torch.cuda.memory_allocated() / mb:.0f}MB"
            )
            self._runs += 1
            if self._runs == self._max_runs:
                logger.info("\n" + torch.cuda.memory_summary())
            torch.cuda.reset_peak_memory_stats()
