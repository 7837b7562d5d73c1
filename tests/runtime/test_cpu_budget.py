"""The CPUs a process may use: affinity and cgroup quota (v2 and v1 files)."""
from reid_engine.runtime.cpu_budget import affinity_cpus, cgroup_cpu_limit, usable_cpus


def _cgroup(tmp_path, membership):
    """A fake /proc/self/cgroup and the two mounts; returns the reader's keyword arguments."""
    (tmp_path / "proc_cgroup").write_text(membership)
    (tmp_path / "v2").mkdir()
    (tmp_path / "v1").mkdir()
    return dict(proc_cgroup=str(tmp_path / "proc_cgroup"), v2_root=str(tmp_path / "v2"), v1_root=str(tmp_path / "v1"))


def test_cgroup_v2_quota_of_the_root_and_unlimited(tmp_path):
    where = _cgroup(tmp_path, "0::/\n")
    cpu_max = tmp_path / "v2" / "cpu.max"
    cpu_max.write_text("200000 100000\n")
    assert cgroup_cpu_limit(**where) == 2.0
    cpu_max.write_text("max 100000\n")
    assert cgroup_cpu_limit(**where) is None  # unlimited
    cpu_max.unlink()
    assert cgroup_cpu_limit(**where) is None  # no file at all


def test_cgroup_v1_quota_and_its_unlimited(tmp_path):
    where = _cgroup(tmp_path, "4:memory:/x\n2:cpu,cpuacct:/\n0::/\n")
    (tmp_path / "v1" / "cpu.cfs_quota_us").write_text("150000")
    (tmp_path / "v1" / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_limit(**where) == 1.5
    (tmp_path / "v1" / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_cpu_limit(**where) is None


def test_cgroup_quota_of_the_process_own_group_and_its_ancestors(tmp_path):
    """A job in a limited sub-group of an unlimited machine (a container's slice, a batch job's
    group) is bound by its own group's quota, or an ancestor's when that is tighter."""
    where = _cgroup(tmp_path, "2:cpu,cpuacct:/jobs/job1\n0::/slice/job\n")
    for root, files in (("v1", {"jobs/job1": "100000", "jobs": "300000", "": "-1"}),):
        for folder, quota in files.items():
            path = tmp_path / root / folder
            path.mkdir(parents=True, exist_ok=True)
            (path / "cpu.cfs_quota_us").write_text(quota)
            (path / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_limit(**where) == 1.0
    (tmp_path / "v1" / "jobs" / "cpu.cfs_quota_us").write_text("50000")  # the parent is tighter
    assert cgroup_cpu_limit(**where) == 0.5
    (tmp_path / "v2" / "slice" / "job").mkdir(parents=True)
    (tmp_path / "v2" / "slice" / "job" / "cpu.max").write_text("25000 100000")  # v2 too: the tightest wins
    assert cgroup_cpu_limit(**where) == 0.25


def test_cgroup_path_missing_under_the_mount_reads_the_mount_root(tmp_path):
    """A container without a cgroup namespace lists the host's path (/docker/<id>), which does not
    exist under its own mount: the mount's root is then the container's group."""
    where = _cgroup(tmp_path, "0::/docker/abc\n")
    (tmp_path / "v2" / "cpu.max").write_text("200000 100000")
    assert cgroup_cpu_limit(**where) == 2.0


def test_the_real_process_reads_without_error():
    limit = cgroup_cpu_limit()
    assert limit is None or limit > 0


def test_usable_cpus_takes_the_tighter_bound_rounded_down():
    assert usable_cpus(limit=2.0, affinity=64) == (2, "cgroup quota 2 of affinity 64")
    assert usable_cpus(limit=2.5, affinity=64)[0] == 2
    assert usable_cpus(limit=0.5, affinity=64)[0] == 1
    assert usable_cpus(limit=8.0, affinity=4) == (4, "affinity 4")
    assert usable_cpus(limit=None, affinity=3) == (3, "affinity 3")
    assert affinity_cpus() >= 1
