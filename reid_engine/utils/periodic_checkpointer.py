"""Checkpoints on a schedule: every N iterations and at the end, keeping the newest N.

fvcore's `PeriodicCheckpointer` with the schedule checked up front (one-line usage errors)
and keep-last-N done by scanning the folder, so it holds across restarts.
"""
import contextlib
import logging
import os
import re
from typing import Any, List, Optional

from fvcore.common.checkpoint import Checkpointer as _FvCheckpointer
from fvcore.common.checkpoint import PeriodicCheckpointer as _FvPeriodicCheckpointer

from .errors import USAGE_EXIT_CODE, ReidUserError

__all__ = ["PeriodicCheckpointer", "CheckpointScheduleError"]

# The checkpoint module's logger: the lines keep the source name they have always had.
logger = logging.getLogger("reid_engine.utils.checkpoint")


class CheckpointScheduleError(ReidUserError, ValueError):
    """A checkpoint period or max_to_keep out of range (a config value: a usage error)."""

    exit_code = USAGE_EXIT_CODE


class PeriodicCheckpointer(_FvPeriodicCheckpointer):
    """Save ``{prefix}_{iter:07d}`` every `period` iterations and ``{prefix}_final`` at the end.

    With `max_to_keep`, after each periodic save only the newest N periodic files in
    the folder are kept; the folder (not memory) is the record, so this holds across
    restarts. The file ``last_checkpoint`` names and ``*_final`` / ``*_best`` files are
    never deleted.

    Args:
        checkpointer: the Checkpointer that writes the files.
        period: save when ``(iteration + 1) % period == 0``.
        max_iter: when given, save ``{prefix}_final`` at iteration ``max_iter - 1``.
        max_to_keep: how many periodic checkpoints to keep (None: all).
        file_prefix: file name prefix.
    """

    def __init__(
        self,
        checkpointer: _FvCheckpointer,
        period: int,
        max_iter: Optional[int] = None,
        max_to_keep: Optional[int] = None,
        file_prefix: str = "model",
    ) -> None:
        if int(period) < 1:
            raise CheckpointScheduleError(
                f"checkpoint period must be a positive number of iterations, got {period}; "
                "set SOLVER.CHECKPOINT_PERIOD (epochs) to 1 or more")
        if max_to_keep is not None and int(max_to_keep) < 1:
            raise CheckpointScheduleError(
                f"max_to_keep must be at least 1 (or None to keep all), got {max_to_keep}; "
                "set SOLVER.CHECKPOINT_MAX_TO_KEEP to 1 or more, or 0 to keep every checkpoint")
        # fvcore's own keep-last-N remembers files in memory and forgets them on a
        # restart; it stays off and `step` prunes by scanning the folder instead.
        super().__init__(checkpointer, period, max_iter=max_iter, max_to_keep=None, file_prefix=file_prefix)
        self.keep_last_n = None if max_to_keep is None else int(max_to_keep)
        self._periodic_name = re.compile(r"^" + re.escape(file_prefix) + r"_(\d{7})\.pth$")

    def step(self, iteration: int, **kwargs: Any) -> None:
        """Save when the schedule says so (fvcore's schedule), then prune old periodic files.

        Args:
            iteration: the iteration just finished, in [0, max_iter - 1].
            kwargs: extra entries for the checkpoint (``iteration`` is always added).
        """
        super().step(iteration, **kwargs)
        if self.keep_last_n is not None and (int(iteration) + 1) % self.period == 0:
            self.delete_old_checkpoints()

    def delete_old_checkpoints(self) -> List[str]:
        """Delete periodic files in the folder beyond the newest `max_to_keep`.

        Returns:
            list: the paths deleted (empty on processes that do not write).
        """
        save_dir = self.checkpointer.save_dir
        if not save_dir or not self.checkpointer.save_to_disk or self.keep_last_n is None:
            return []
        periodic = []
        for name in os.listdir(save_dir):
            match = self._periodic_name.match(name)
            if match:
                periodic.append((int(match.group(1)), name))
        periodic.sort()
        protected = os.path.basename(self.checkpointer.get_checkpoint_file())
        deleted = []
        for _, name in periodic[: max(0, len(periodic) - self.keep_last_n)]:
            if name == protected:
                continue
            path = os.path.join(save_dir, name)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                deleted.append(path)
        if deleted:
            logger.info("Deleted %d old checkpoint(s), keeping the newest %d: %s",
                        len(deleted), self.keep_last_n, ", ".join(os.path.basename(p) for p in deleted))
        return deleted
