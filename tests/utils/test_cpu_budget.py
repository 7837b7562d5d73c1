"""The CPUs a process may use: affinity and cgroup quota (v2 and v1 files)."""
from reid_engine.utils.cpu_budget import affinity_cpus, cgroup_cpu_limit, usable_cpus


def test_cgroup_quota_files(tmp_path):
    v2 = tmp_path / "cpu.max"
    v1 = (str(tmp_path / "quota"), str(tmp_path / "period"))
    v2.write_text("200000 100000\n")
    assert cgroup_cpu_limit(str(v2), v1) == 2.0
    v2.write_text("max 100000\n")
    assert cgroup_cpu_limit(str(v2), v1) is None  # unlimited
    v2.unlink()
    (tmp_path / "quota").write_text("150000")
    (tmp_path / "period").write_text("100000")
    assert cgroup_cpu_limit(str(v2), v1) == 1.5
    (tmp_path / "quota").write_text("-1")  # v1's unlimited
    assert cgroup_cpu_limit(str(v2), v1) is None
    assert cgroup_cpu_limit(str(tmp_path / "none"), (str(tmp_path / "a"), str(tmp_path / "b"))) is None


def test_usable_cpus_takes_the_tighter_bound_rounded_down():
    assert usable_cpus(limit=2.0, affinity=64) == (2, "cgroup quota 2 of affinity 64")
    assert usable_cpus(limit=2.5, affinity=64)[0] == 2
    assert usable_cpus(limit=0.5, affinity=64)[0] == 1
    assert usable_cpus(limit=8.0, affinity=4) == (4, "affinity 4")
    assert usable_cpus(limit=None, affinity=3) == (3, "affinity 3")
    assert affinity_cpus() >= 1
