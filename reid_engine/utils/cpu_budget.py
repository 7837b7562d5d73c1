"""How many CPUs this process may really use: its affinity mask and its cgroup's CPU quota.

torch sizes its thread pool from the host's cores. In a container limited to 2 CPUs on a
64-core host, or a process pinned to a few cores, that is many more compute threads than
the process can run at once: threads then wait for each other at every parallel region's
barrier, and a step slows by far more than the lost cores explain.
"""
import math
import os
from typing import Optional, Tuple

__all__ = ["affinity_cpus", "cgroup_cpu_limit", "usable_cpus"]

# cgroup v2 (one file: "quota period" or "max period"), then v1 (two files).
_CGROUP_V2 = "/sys/fs/cgroup/cpu.max"
_CGROUP_V1 = ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def affinity_cpus() -> int:
    """The CPUs this process may be scheduled on (its affinity mask; os.cpu_count() where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cgroup_cpu_limit(v2_path: str = _CGROUP_V2, v1_paths: Tuple[str, str] = _CGROUP_V1) -> Optional[float]:
    """The CPU quota of this process's cgroup in CPUs (e.g. 2.0 for ``200000 100000``), None when unlimited.

    Args:
        v2_path: cgroup v2's cpu.max.
        v1_paths: cgroup v1's cfs_quota_us and cfs_period_us.
    """
    text = _read(v2_path)
    if text:
        parts = text.split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                quota, period = float(parts[0]), float(parts[1])
            except ValueError:
                return None
            return quota / period if quota > 0 and period > 0 else None
        return None
    quota_text, period_text = (_read(p) for p in v1_paths)
    try:
        quota, period = float(quota_text), float(period_text)
    except (TypeError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus(limit: Optional[float] = None, affinity: Optional[int] = None) -> Tuple[int, str]:
    """The CPUs this process can run on at once, and where that number comes from.

    Args:
        limit: the cgroup quota in CPUs (default: read it); None or <= 0 for none.
        affinity: the affinity CPU count (default: read it).
    Returns:
        (cpus, source): at least 1; source names the binding constraint ("affinity 4",
        "cgroup quota 2.0 of affinity 64").
    """
    affinity = affinity_cpus() if affinity is None else int(affinity)
    limit = cgroup_cpu_limit() if limit is None else limit
    # Rounded down: more busy threads than the quota only get the group throttled in bursts.
    if limit is not None and limit > 0 and math.floor(limit) < affinity:
        return max(1, math.floor(limit)), f"cgroup quota {limit:g} of affinity {affinity}"
    return max(1, affinity), f"affinity {affinity}"
