"""How many CPU threads compute, and whether idle OpenMP threads spin: decided from how busy the cores are.

Measured on 2 cores (docs/benchmarks.md, "Shared cores"): on quiet cores, idle threads that spin
a while before they sleep (OpenMP's default) give the fastest steps, and PASSIVE (sleep at once)
costs a quarter or more of the speed. Beside a busy process the same spinning collapses the step
several-fold, while one thread fewer per busy core keeps it within 1.6x of the quiet step. So:

1. At start, before torch is imported (libgomp reads OMP_WAIT_POLICY once, when torch loads it),
   :func:`choose_at_start` measures other processes' CPU use for 0.1 s: quiet cores keep OpenMP's
   default wait policy, busy ones get PASSIVE. The measurement goes to child processes in
   ``REID_ENGINE_BUSY_CPUS``, so a launcher's workers share it instead of measuring each other.
2. The run plan's intra-op thread count (``plan_rules.cpu_threads``) leaves the busy CPUs out.
3. During training, :class:`ThreadBudget` follows the load (the engine's ``ThreadBudgetHook``): a
   neighbour that starts or stops later moves the thread count within the plan's.

A user's OMP_WAIT_POLICY or OMP_NUM_THREADS wins over all of it. Linux only (``/proc``); elsewhere
the policy is PASSIVE and the threads stay the plan's. Standard library only: the command line
imports this module before torch.
"""
import dataclasses
import multiprocessing
import os
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

__all__ = ["BUSY_ENV", "QUIET_BELOW", "LoadMeter", "ThreadBudget", "busy_at_start", "choose_at_start",
           "busy_measured", "start_choice", "threads_left", "wait_policy_decision"]

BUSY_ENV = "REID_ENGINE_BUSY_CPUS"
# Other processes' use, in CPUs, under which the cores count as quiet (a shell, a logger, an editor).
QUIET_BELOW = 0.5
PROBE_S = 0.1
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (guest time is inside user)


def _cpu_jiffies(cpus: Iterable[int], stat_path: str) -> Optional[Tuple[int, int]]:
    """(busy, total) jiffies of `cpus` since boot from /proc/stat, or None where it cannot be read."""
    wanted = {f"cpu{c}" for c in cpus}
    busy = total = 0
    try:
        with open(stat_path) as f:
            for line in f:
                name, *values = line.split()
                if name in wanted:
                    numbers = [int(v) for v in values[:8]]
                    busy += sum(numbers[i] for i in _BUSY_FIELDS)
                    total += sum(numbers)
    except (OSError, ValueError):
        return None
    return (busy, total) if total else None


def _process_jiffies(pids: Iterable[int], proc: str = "/proc") -> int:
    """User + system jiffies of the processes `pids` (each whole process, all its threads)."""
    jiffies = 0
    for pid in pids:
        try:
            with open(os.path.join(proc, str(pid), "stat")) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            jiffies += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass  # a worker that just ended
    return jiffies


def _own_pids() -> List[int]:
    """This process and its live child processes (the data loader's workers)."""
    return [os.getpid()] + [child.pid for child in multiprocessing.active_children()]


class LoadMeter:
    """Other processes' CPU use on the CPUs this process may run on, between two samples.

    Args:
        cpus: the CPU numbers to watch (default: this process's affinity).
        stat_path: the kernel's CPU counters.
        own_jiffies: the CPU time of this process and its children (default: read from /proc).
    """

    def __init__(self, cpus: Optional[Iterable[int]] = None, stat_path: str = "/proc/stat",
                 own_jiffies: Optional[Callable[[], int]] = None):
        self._cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        self._stat_path = stat_path
        self._own = own_jiffies or (lambda: _process_jiffies(_own_pids()))
        self._last = self._read()

    def _read(self) -> Optional[Tuple[int, int, int]]:
        machine = _cpu_jiffies(self._cpus, self._stat_path)
        return None if machine is None else (*machine, self._own())

    def sample(self) -> Optional[float]:
        """Other processes' use since the last sample, in CPUs (None: unreadable, or too short a time)."""
        now, last = self._read(), self._last
        if now is None or last is None or now[1] <= last[1]:
            return None
        self._last = now
        others = (now[0] - last[0]) - (now[2] - last[2])
        return max(0.0, others / (now[1] - last[1]) * len(self._cpus))


def busy_measured(environ: Mapping[str, str] = os.environ) -> Optional[float]:
    """Other processes' CPU use that this command (or the one that started it) measured at start, if any."""
    try:
        return float(environ[BUSY_ENV])
    except (KeyError, ValueError):
        return None


def busy_at_start(environ: Mapping[str, str] = os.environ, probe_s: float = PROBE_S) -> Optional[float]:
    """Other processes' CPU use now: inherited from a parent command, else measured for `probe_s` seconds.

    None where it cannot be known: no /proc, or a torchrun sibling (the others start at the same
    moment and would count each other as load); and, without measuring, where nothing would read it:
    the user set both OMP_WAIT_POLICY and OMP_NUM_THREADS.
    """
    if BUSY_ENV in environ:
        return busy_measured(environ)
    if "OMP_WAIT_POLICY" in environ and environ.get("OMP_NUM_THREADS", "").strip():
        return None
    if int(environ.get("LOCAL_WORLD_SIZE", "1") or 1) > 1:
        return None
    meter = LoadMeter()
    time.sleep(probe_s)
    return meter.sample()


def wait_policy_decision(busy: Optional[float], environ: Mapping[str, str] = os.environ) -> Tuple[Optional[str], str]:
    """(OMP_WAIT_POLICY to set, or None to leave the environment alone; why)."""
    if "OMP_WAIT_POLICY" in environ:
        return None, f"OMP_WAIT_POLICY {environ['OMP_WAIT_POLICY'] or '(empty: OpenMP default)'} set by the user"
    if busy is None:
        return "PASSIVE", "the cores' load is unknown: idle threads sleep at once"
    if busy < QUIET_BELOW:
        return None, f"quiet cores at start ({busy:.1f} CPUs busy): OpenMP's default, spin a while, then sleep"
    return "PASSIVE", f"{busy:.1f} CPUs busy at start: idle threads sleep at once"


def threads_left(usable: int, busy: Optional[float]) -> int:
    """Intra-op threads for `usable` CPUs when other processes use `busy` of them (one per busy core less)."""
    if busy is None or busy < QUIET_BELOW:
        return usable
    return max(1, min(usable, usable - int(busy + 0.5)))


@dataclasses.dataclass
class StartChoice:
    """What :func:`choose_at_start` decided (read by the run plan's table)."""

    busy: Optional[float]
    wait_policy: str
    reason: str


_START: Dict[str, StartChoice] = {}


def choose_at_start(environ=os.environ) -> StartChoice:
    """Measure the cores and set OMP_WAIT_POLICY (unless the user has) and ``REID_ENGINE_BUSY_CPUS`` in
    `environ`; call before torch is imported. Returns the choice, also kept for :func:`start_choice`."""
    busy = busy_at_start(environ)
    policy, reason = wait_policy_decision(busy, environ)
    if policy is not None:
        environ["OMP_WAIT_POLICY"] = policy
    if busy is not None:
        environ[BUSY_ENV] = f"{busy:.2f}"
    _START["choice"] = StartChoice(busy, environ.get("OMP_WAIT_POLICY", "") or "OpenMP default", reason)
    return _START["choice"]


def start_choice() -> Optional[StartChoice]:
    """The choice :func:`choose_at_start` made in this process (None: it did not run, e.g. a Python API run)."""
    return _START.get("choice")


class ThreadBudget:
    """The intra-op thread count that follows other processes' load during training.

    Every `period_s` seconds it samples the load; a new count is returned once the same one was
    due `patience` samples running (a moment's load does not move it). Never above `cap`.

    Args:
        threads: the count now (the run plan's).
        cap: the most threads this process takes (its share of the usable CPUs).
        usable: the CPUs this process may use.
        meter: the load meter (default: a new :class:`LoadMeter`).
    """

    def __init__(self, threads: int, cap: int, usable: int, meter: Optional[LoadMeter] = None,
                 period_s: float = 2.0, patience: int = 2, clock=time.monotonic):
        self.cap, self.usable, self.threads = cap, usable, threads
        self._meter = meter if meter is not None else LoadMeter()
        self._period_s, self._patience, self._clock = period_s, patience, clock
        self._next = clock() + period_s
        self._due: Optional[int] = None
        self._seen = 0
        self.busy: Optional[float] = None

    def update(self) -> Optional[int]:
        """The new thread count when it changes now, else None."""
        now = self._clock()
        if now < self._next:
            return None
        self._next = now + self._period_s
        self.busy = self._meter.sample()
        if self.busy is None:
            return None
        due = min(self.cap, threads_left(self.usable, self.busy))
        self._seen = self._seen + 1 if due == self._due else 1
        self._due = due
        if due != self.threads and self._seen >= self._patience:
            self.threads = due
            return due
        return None
