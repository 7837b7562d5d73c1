"""The CPU thread policy: the load it measures, the wait policy and thread counts it picks, and how
training follows the load (runtime.thread_policy, engine.hooks.threads)."""
import os
import subprocess
import sys
import time

import torch

from reid_engine.engine.hooks import ThreadBudgetHook
from reid_engine.runtime import thread_policy as tp
from reid_engine.runtime.plan_rules import adapts_threads, cpu_threads


def _stat(path, rows):
    """A /proc/stat with one `cpuN user nice system idle iowait irq softirq steal` line per row."""
    with open(path, "w") as f:
        f.write("cpu  0 0 0 0 0 0 0 0 0 0\n")
        for n, (busy, idle) in enumerate(rows):
            f.write(f"cpu{n} {busy} 0 0 {idle} 0 0 0 0 0 0\n")
        f.write("intr 0\n")


def test_the_meter_counts_other_processes_on_its_own_cpus_only(tmp_path):
    path, own = str(tmp_path / "stat"), [0]
    _stat(path, [(10, 10), (10, 10), (10, 10)])
    meter = tp.LoadMeter(cpus=[0, 1], stat_path=path, own_jiffies=lambda: own[0])
    # 200 jiffies on cpus 0-1: 150 busy, of which 50 are this process's; cpu2 (not ours) is busy too
    _stat(path, [(110, 10), (60, 60), (110, 10)])
    own[0] = 50
    assert meter.sample() == 1.0  # (150 - 50) / 200 jiffies * 2 CPUs
    assert meter.sample() is None  # no time has passed: nothing to say
    assert tp.LoadMeter(stat_path=str(tmp_path / "missing")).sample() is None


def test_a_busy_process_beside_this_one_is_measured():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # its start-up
        meter = tp.LoadMeter()
        time.sleep(0.5)
        assert meter.sample() >= 0.5
    finally:
        busy.kill()
        busy.wait()


def test_the_wait_policy_and_threads_follow_the_load_and_the_user_wins():
    assert tp.wait_policy_decision(0.1, {}) == (None, "quiet cores at start (0.1 CPUs busy): OpenMP's default, "
                                                      "spin a while, then sleep")
    assert tp.wait_policy_decision(1.0, {})[0] == "PASSIVE"
    assert tp.wait_policy_decision(None, {})[0] == "PASSIVE"
    assert tp.wait_policy_decision(1.0, {"OMP_WAIT_POLICY": "ACTIVE"})[0] is None
    assert [tp.threads_left(2, b) for b in (None, 0.0, 0.4, 0.67, 1.0, 2.0)] == [2, 2, 2, 1, 1, 1]
    assert tp.threads_left(8, 1.2) == 7
    threads, reason = cpu_threads(1, environ={tp.BUSY_ENV: "1.00"}, usable=(2, "affinity 2"))
    assert (threads, reason) == (1, "affinity 2, 1.0 busy with other processes at start (OMP_NUM_THREADS overrides)")
    assert cpu_threads(1, environ={tp.BUSY_ENV: "0.10"}, usable=(2, "affinity 2"))[0] == 2
    assert cpu_threads(1, environ={tp.BUSY_ENV: "1.00", "OMP_NUM_THREADS": "2"}, usable=(2, "affinity 2"))[0] == 2
    assert adapts_threads("cpu", "train", environ={}, usable=(2, "affinity 2"))[0]
    assert not adapts_threads("cpu", "train", environ={"OMP_NUM_THREADS": "2"}, usable=(2, "affinity 2"))[0]
    assert not adapts_threads("cpu", "train", environ={}, usable=(2, "cgroup quota 2 of affinity 64"))[0]
    assert not adapts_threads("cpu", "evaluate", environ={}, usable=(2, "affinity 2"))[0]


def test_the_start_choice_is_inherited_set_in_the_environment_and_made_before_torch_loads():
    environ = {tp.BUSY_ENV: "1.50"}
    choice = tp.choose_at_start(environ)
    assert (choice.busy, environ["OMP_WAIT_POLICY"]) == (1.5, "PASSIVE")
    environ = {tp.BUSY_ENV: "0.00", "OMP_WAIT_POLICY": "ACTIVE"}
    assert tp.choose_at_start(environ).wait_policy == "ACTIVE" and environ["OMP_WAIT_POLICY"] == "ACTIVE"
    environ = {tp.BUSY_ENV: "0.00"}
    tp.choose_at_start(environ)
    assert "OMP_WAIT_POLICY" not in environ  # quiet: OpenMP's default
    environ = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"}  # nothing would read a measurement
    assert tp.choose_at_start(environ).busy is None and tp.BUSY_ENV not in environ
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", tp.BUSY_ENV)}
    out = subprocess.run([sys.executable, "-c", "import os, sys, reid_engine.cli; "
                          f"print('torch' in sys.modules, os.environ.get('{tp.BUSY_ENV}') is not None)"],
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]  # measured, and torch not yet loaded: OMP_WAIT_POLICY still counts


class _Meter:
    def __init__(self, loads):
        self.loads = list(loads)

    def sample(self):
        return self.loads.pop(0)


def test_the_budget_moves_after_two_samples_in_a_row_and_stays_in_its_share():
    now = [0.0]
    budget = tp.ThreadBudget(2, 2, 2, meter=_Meter([1.0, 0.0, 1.0, 1.0, 3.0, 0.2, 0.2]), period_s=2.0,
                             clock=lambda: now[0])
    changes = []
    for _ in range(7):
        assert budget.update() is None  # between samples: nothing read
        now[0] += 2.0
        changes.append(budget.update())
    assert changes == [None, None, None, 1, None, None, 2]
    assert tp.ThreadBudget(1, 1, 8, meter=_Meter([0.0, 0.0]), period_s=0, clock=lambda: 1.0).update() is None


def test_the_hook_sets_torch_threads_and_restores_them(monkeypatch):
    class Trainer:
        iter = 5

    before = torch.get_num_threads()
    budget = tp.ThreadBudget(before + 1, before + 1, before + 1, meter=_Meter([0.0, 0.0]), period_s=0,
                             patience=1, clock=lambda: 1.0)
    budget.threads = before
    hook = ThreadBudgetHook(before + 1, budget)
    hook.trainer = Trainer()
    try:
        hook.before_train()
        hook.after_step()
        assert torch.get_num_threads() == before + 1
        budget.threads = before + 2  # what the hook would restore from
        hook._threads = before
        hook.after_train()
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
