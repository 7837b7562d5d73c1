"""The intra-op thread count during CPU training follows other processes' load (runtime.thread_policy)."""
import logging
from typing import Optional

import torch

from ...runtime.cpu_budget import usable_cpus
from ...runtime.thread_policy import ThreadBudget
from ...utils import comm
from ..train_loop import HookBase

logger = logging.getLogger(__name__)


class ThreadBudgetHook(HookBase):
    """Every couple of seconds, set torch's intra-op threads to what the busy cores leave free (never
    above this process's share of the usable CPUs); back to the plan's count when training ends.

    Args:
        threads: the run plan's thread count.
        budget: the policy (default: a :class:`ThreadBudget` on this machine's usable CPUs).
    """

    def __init__(self, threads: int, budget: Optional[ThreadBudget] = None):
        self._threads = threads
        self._budget = budget

    def before_train(self):
        if self._budget is None:
            usable = usable_cpus()[0]
            self._budget = ThreadBudget(self._threads, max(1, usable // comm.get_local_size()), usable)

    def after_step(self):
        threads = self._budget.update()
        if threads is not None:
            torch.set_num_threads(threads)
            logger.info("Other processes use %.1f CPUs: %d intra-op thread(s) from iteration %d",
                        self._budget.busy, threads, self.trainer.iter + 1)

    def after_train(self):
        if self._budget is not None and self._budget.threads != self._threads:
            torch.set_num_threads(self._threads)
