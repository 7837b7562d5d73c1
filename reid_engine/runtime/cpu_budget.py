"""How many CPUs this process may really use: its affinity mask and its cgroup's CPU quota.

torch sizes its thread pool from the host's cores. In a container limited to 2 CPUs on a
64-core host, or a process pinned to a few cores, that is many more compute threads than
the process can run at once: threads then wait for each other at every parallel region's
barrier, and a step slows by far more than the lost cores explain.
"""
import math
import os
from typing import List, Optional, Tuple

__all__ = ["affinity_cpus", "cgroup_cpu_limit", "usable_cpus"]

#: where the cgroup hierarchies are mounted: v2 (unified), v1's cpu controller
_CGROUP_ROOT_V2 = "/sys/fs/cgroup"
_CGROUP_ROOT_V1 = "/sys/fs/cgroup/cpu"


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


def _own_cgroup_paths(proc_cgroup: str) -> Tuple[Optional[str], Optional[str]]:
    """This process's cgroup path in the v2 hierarchy and in v1's cpu controller (from /proc/self/cgroup)."""
    v2 = v1 = None
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _levels(root: str, own: Optional[str]) -> List[str]:
    """The folders to read a limit from: the process's own cgroup and each ancestor up to `root`.

    Inside a container without a cgroup namespace the own path (e.g. /docker/<id>) does not
    exist under the container's mount, whose root is then the container's own cgroup.
    """
    levels = []
    path = (own or "/").strip("/")
    while path:
        folder = os.path.join(root, path)
        if os.path.isdir(folder):
            levels.append(folder)
        path = os.path.dirname(path)
    return levels + [root]


def _quota_v2(folder: str) -> Optional[float]:
    parts = (_read(os.path.join(folder, "cpu.max")) or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _ratio(parts[0], parts[1])


def _quota_v1(folder: str) -> Optional[float]:
    return _ratio(_read(os.path.join(folder, "cpu.cfs_quota_us")), _read(os.path.join(folder, "cpu.cfs_period_us")))


def _ratio(quota_text: Optional[str], period_text: Optional[str]) -> Optional[float]:
    try:
        quota, period = float(quota_text), float(period_text)
    except (TypeError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None  # v1's -1: unlimited


def cgroup_cpu_limit(proc_cgroup: str = "/proc/self/cgroup", v2_root: str = _CGROUP_ROOT_V2,
                     v1_root: str = _CGROUP_ROOT_V1) -> Optional[float]:
    """The CPU quota of this process's cgroup in CPUs (e.g. 2.0 for ``200000 100000``), None when unlimited.

    The tightest quota of the process's own cgroup and its ancestors, in cgroup v2 (cpu.max) and
    v1 (cpu.cfs_quota_us / cpu.cfs_period_us): a job started in a limited sub-group of a machine
    is bound by it even where the machine's (or container's) root group is unlimited.

    Args:
        proc_cgroup: the process's cgroup membership file.
        v2_root, v1_root: where cgroup v2 and v1's cpu controller are mounted.
    """
    own_v2, own_v1 = _own_cgroup_paths(proc_cgroup)
    limits = [_quota_v2(folder) for folder in _levels(v2_root, own_v2)]
    limits += [_quota_v1(folder) for folder in _levels(v1_root, own_v1)]
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


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
