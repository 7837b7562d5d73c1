"""tools/gpu_acceptance.py on the CPU: caps kill overrunning parts, the archive is refreshed while
the run goes on, the run folders' readers, and one real tiny training part end to end."""
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time

import pytest
import torch

from tests.conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "tools", "gpu_acceptance.py")
PY = shlex.quote(sys.executable)
# A part that ignores SIGTERM (only SIGKILL ends it), after writing its pid where told.
STUBBORN = (PY + " -c \"import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open(sys.argv[1], 'w').write(str(os.getpid())); print('stubborn started', flush=True); time.sleep(60)\" {}")
# The same with a child in its process group: writes "<own pid> <child pid>" once both run.
STUBBORN_PARENT = (PY + " -c \"import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "child = subprocess.Popen(['sleep', '60']); open(sys.argv[1], 'w').write('%d %d' % (os.getpid(), child.pid)); "
                   "print('stubborn started', flush=True); time.sleep(60)\" {}")
# A part that records its start and end (time.time()) in a file, with `sleep` seconds between.
WINDOW = "sh -c 'date +%s.%N > {0}; sleep {1}; date +%s.%N >> {0}'"


def _load():
    """The script as a module (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def acceptance():
    return _load()


def _dirs(tmp_path):
    return ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--data-root", str(tmp_path / "data")]


def _members(archive):
    """{name: text} of an archive's files."""
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


def _gone(pid, wait_s=5.0):
    """Whether the process has ended (a zombie not yet reaped by init counts as ended)."""
    deadline = time.time() + wait_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        if time.time() > deadline:
            return False
        time.sleep(0.1)


def test_a_part_over_its_cap_is_killed_and_the_run_goes_on(acceptance, tmp_path, capsys):
    pid_file = tmp_path / "pid"
    rc = acceptance.main(_dirs(tmp_path) + [
        "--fake-part", "stubborn=" + STUBBORN.format(pid_file), "--fake-part", f"after={PY} -c \"print('after ran')\"",
        "--parts", "stubborn", "after", "--caps", "stubborn=1", "--grace", "0.5", "--min-start", "0"])
    assert rc == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert [(r["part"], r["status"]) for r in rows] == [("stubborn", "killed after 1 s (cap)"), ("after", "ok")]
    assert _gone(int(pid_file.read_text())), "SIGKILL did not follow the ignored SIGTERM"
    table = capsys.readouterr().out
    assert "| stubborn | killed after 1 s (cap) |" in table and "| after    | ok" in table, table
    members = _members(tmp_path / "acceptance_logs.tar.gz")
    assert "stubborn started" in members["out/logs/stubborn.log"] and "after ran" in members["out/logs/after.log"]
    assert "killed after 1 s (cap)" in members["out/table.md"]


def test_the_archive_holds_the_logs_while_the_run_goes_on(tmp_path):
    pid_file = tmp_path / "pid"
    archive = tmp_path / "logs.tar.gz"
    proc = subprocess.Popen([sys.executable, SCRIPT, *_dirs(tmp_path), "--archive", str(archive), "--pack-every", "0.2",
                             "--fake-part", "stubborn=" + STUBBORN.format(pid_file), "--parts", "stubborn"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, log = time.time() + 30, ""
        while time.time() < deadline and "stubborn started" not in log:
            time.sleep(0.2)
            if archive.exists():
                log = _members(archive).get("out/logs/stubborn.log", "")
        assert "stubborn started" in log and proc.poll() is None
        running = json.loads(_members(archive)["out/results.json"])["rows"]
        assert running == [{"part": "stubborn", "status": "running"}]
        proc.send_signal(signal.SIGTERM)  # cut off from outside: the part is killed, the results packed
        output, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, output
    assert _gone(int(pid_file.read_text()))
    rows = json.loads(_members(archive)["out/results.json"])["rows"]
    assert rows == [{"part": "stubborn", "status": "interrupted"}], output


@pytest.mark.slow  # the env probe imports torch in a fresh interpreter
def test_where_the_package_does_not_import_only_the_env_facts_are_printed(tmp_path, monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "reid_engine.utils.file_io", None)  # its import now fails
    assert _load().main(_dirs(tmp_path)) == 1
    out = capfd.readouterr().out
    assert "error: reid_engine does not import" in out and '"torch": ' in out.split("ENV ", 1)[1], out
    assert not (tmp_path / "out").exists()


def test_parts_past_the_budget_are_skipped(acceptance, tmp_path):
    assert acceptance.main(_dirs(tmp_path) + ["--fake-part", f"a={PY} -c pass", "--parts", "a", "--budget", "0"]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert [(r["part"], r["status"], r["wall_s"]) for r in rows] == [("a", "skipped: budget", None)]
    assert not (tmp_path / "out" / "logs" / "a.log").exists()


def _rows(tmp_path):
    return json.loads((tmp_path / "out" / "results.json").read_text())["rows"]


def _window(path):
    """(start, end) that a WINDOW part wrote."""
    start, end = map(float, path.read_text().split())
    return start, end


@pytest.mark.parametrize("jobs", [1, 2])
def test_shared_parts_run_at_once_only_with_several_jobs(acceptance, tmp_path, jobs):
    a, b = tmp_path / "a.times", tmp_path / "b.times"
    rc = acceptance.main(_dirs(tmp_path) + [
        "--fake-shared-part", "a=" + WINDOW.format(a, 1), "--fake-shared-part", "b=" + WINDOW.format(b, 1),
        "--parts", "a", "b", "--jobs", str(jobs), "--min-start", "0"])
    assert rc == 0
    rows = _rows(tmp_path)
    assert [(r["part"], r["status"], r["shared"]) for r in rows] == [("a", "ok", jobs - 1), ("b", "ok", jobs - 1)]
    (a0, a1), (b0, b1) = _window(a), _window(b)
    assert (a0 < b1 and b0 < a1) == (jobs == 2), (a0, a1, b0, b1)


def test_a_shared_part_over_its_cap_is_killed_with_its_child_beside_a_neighbour(acceptance, tmp_path):
    pids = tmp_path / "pids"
    rc = acceptance.main(_dirs(tmp_path) + [
        "--fake-shared-part", "stubborn=" + STUBBORN_PARENT.format(pids),
        "--fake-shared-part", "neighbour=" + WINDOW.format(tmp_path / "n.times", 1),
        "--parts", "stubborn", "neighbour", "--caps", "stubborn=2", "--grace", "0.5", "--min-start", "0", "--jobs", "2"])
    assert rc == 0
    rows = _rows(tmp_path)
    assert [(r["part"], r["status"], r["shared"]) for r in rows] == [
        ("stubborn", "killed after 2 s (cap)", 1), ("neighbour", "ok", 1)]
    parent, child = map(int, pids.read_text().split())
    assert _gone(parent) and _gone(child), "a process of the killed part's group survived"


def test_sigterm_kills_every_shared_part_and_packs_the_results(tmp_path):
    pids = [tmp_path / "a.pids", tmp_path / "b.pids"]
    archive = tmp_path / "logs.tar.gz"
    proc = subprocess.Popen([sys.executable, SCRIPT, *_dirs(tmp_path), "--archive", str(archive), "--jobs", "2",
                             "--fake-shared-part", "a=" + STUBBORN_PARENT.format(pids[0]),
                             "--fake-shared-part", "b=" + STUBBORN_PARENT.format(pids[1]), "--parts", "a", "b"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not all(p.exists() and len(p.read_text().split()) == 2 for p in pids):
            time.sleep(0.1)
        assert proc.poll() is None and all(p.exists() for p in pids), "the two parts did not both start"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, output
    assert all(_gone(int(pid)) for p in pids for pid in p.read_text().split()), "a part's process survived"
    rows = json.loads(_members(archive)["out/results.json"])["rows"]
    assert rows == [{"part": "a", "status": "interrupted"}, {"part": "b", "status": "interrupted"}], output


def test_the_pool_skips_a_part_without_enough_budget_left(acceptance, tmp_path):
    # a and b start at once with 4 s left; c waits for a slot, which frees with at most 2.5 s left
    rc = acceptance.main(_dirs(tmp_path) + [
        "--fake-shared-part", "a=sleep 1.5", "--fake-shared-part", "b=sleep 1.5", "--fake-shared-part", "c=true",
        "--parts", "a", "b", "c", "--jobs", "2", "--budget", "4", "--min-start", "3", "--grace", "0.5"])
    assert rc == 0
    assert [(r["part"], r["status"], r["shared"]) for r in _rows(tmp_path)] == [
        ("a", "ok", 1), ("b", "ok", 1), ("c", "skipped: budget", None)]
    assert not (tmp_path / "out" / "logs" / "c.log").exists()


def test_rows_keep_the_build_order_and_a_part_alone_waits_for_the_pool(acceptance, tmp_path, capsys):
    slow, alone = tmp_path / "slow.times", tmp_path / "alone.times"
    rc = acceptance.main(_dirs(tmp_path) + [
        "--fake-shared-part", "slow=" + WINDOW.format(slow, 1.5), "--fake-shared-part", "quick=true",
        "--fake-part", "alone=" + WINDOW.format(alone, 0.2), "--fake-shared-part", "last=true",
        "--parts", "slow", "quick", "alone", "last", "--jobs", "3", "--min-start", "0"])
    assert rc == 0
    rows = _rows(tmp_path)
    assert [(r["part"], r["status"], r["shared"]) for r in rows] == [
        ("slow", "ok", 1), ("quick", "ok", 1), ("alone", "ok", 0), ("last", "ok", 0)]
    assert _window(alone)[0] >= _window(slow)[1], "the part alone started while a shared part ran"
    printed = capsys.readouterr().out
    assert printed.index("quick: ok") < printed.index("slow: ok"), "quick should end first (the order of the ends)"
    table = [line.split("|")[1].strip() for line in printed.split("\n\n")[1].splitlines()[2:]]
    assert table == ["slow", "quick", "alone", "last"], printed


def test_max_overlap_counts_the_parts_running_at_once_beside_one(acceptance):
    span = (0.0, 10.0)
    assert acceptance.max_overlap(span, []) == 0
    assert acceptance.max_overlap(span, [(10.0, 12.0), (-5.0, 0.0)]) == 0  # touching is not overlapping
    assert acceptance.max_overlap(span, [(1.0, 2.0), (3.0, 4.0)]) == 1  # one after the other
    assert acceptance.max_overlap(span, [(-1.0, 5.0), (4.0, None), (8.0, 9.0)]) == 2  # None: still running


def test_the_headline_parts_run_alone_first_and_pooled_runs_get_fewer_workers(acceptance, tmp_path, monkeypatch):
    monkeypatch.setattr(acceptance, "usable_cpus", lambda: (16, "affinity 16"))
    parts = acceptance.build_parts(acceptance.build_parser().parse_args(_dirs(tmp_path)))  # --jobs 4
    alone = ["env", "data", "bot_eager", "bot_auto", "bot_auto_warm", "fastreid"]
    assert [p.name for p in parts[:6]] == alone and not any(p.shared for p in parts[:6])
    pool = parts[6:]
    assert all(p.shared for p in pool) and pool[0].name == "family:sbs_R50" and pool[-1].name == "bot_auto_blocks"
    families = {"family:" + f.name for f in acceptance.FAMILIES if f is not acceptance.BOT}  # BoT: the bot_* parts
    assert {p.name for p in pool} == {"cuda_tests", "bot_auto_blocks", *families}
    for part in parts:  # Base-bagtricks' 8 workers cut to 16 // 4; the parts alone keep theirs
        if part.commands and part.kind == "train":
            capped = part.commands[-1][-2:] == ["DATALOADER.NUM_WORKERS", "4"]
            assert capped == part.shared, part.name
    for argv in (["--jobs", "1"], ["--tiny"]):  # one at a time, or tiny runs loading in the process
        parts = acceptance.build_parts(acceptance.build_parser().parse_args(_dirs(tmp_path) + argv))
        assert not any(p.commands and p.commands[-1][-2:] == ["DATALOADER.NUM_WORKERS", "4"] for p in parts), argv


def test_loader_workers_are_cut_only_above_the_share(acceptance, tmp_path):
    (tmp_path / "base.yml").write_text("DATALOADER:\n  NUM_WORKERS: 3\n")  # the child inherits 3
    (tmp_path / "child.yml").write_text("_BASE_: base.yml\nMODEL:\n  DEVICE: cuda\n")
    for cpus, added in ((16, []), (8, ["DATALOADER.NUM_WORKERS", "2"])):  # shares 4 and 2 against 3
        part = acceptance.Part("family:x", "train", [["python", "--config-file", str(tmp_path / "child.yml")]])
        acceptance.limit_loader_workers(part, jobs=4, cpus=cpus)
        assert part.commands[-1][3:] == added, cpus


def test_pooled_parts_share_the_compile_threads(acceptance, monkeypatch):
    monkeypatch.setattr(acceptance, "usable_cpus", lambda: (16, "affinity 16"))
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    shared, alone = acceptance.Part("s", "fake", shared=True), acceptance.Part("a", "fake")
    assert acceptance.part_env(shared, jobs=4)["TORCHINDUCTOR_COMPILE_THREADS"] == "4"
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in acceptance.part_env(alone, jobs=4)
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in acceptance.part_env(shared, jobs=1)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "7")  # the user's count wins
    assert acceptance.part_env(shared, jobs=4)["TORCHINDUCTOR_COMPILE_THREADS"] == "7"


@pytest.mark.parametrize("argv", [["--caps", "bot_auto"], ["--caps", "bot_auto=-3"], ["--parts", "no_such_part"],
                                  ["--fake-part", "nocommand"], ["--jobs", "0"]])
def test_bad_arguments_exit_2(acceptance, tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        acceptance.main(_dirs(tmp_path) + argv)
    assert exc.value.code == 2


def test_caps_apply_to_a_part_or_its_group(acceptance):
    caps = acceptance.parse_caps(["family=33", "family:mars=44"])
    assert acceptance.cap_of("family:AGW_R50", caps) == 33 and acceptance.cap_of("family:mars", caps) == 44
    assert acceptance.cap_of("bot_auto", caps) == acceptance.DEFAULT_CAPS["bot_auto"]
    # at their caps, the parts alone (fast-reid is rarely installed) leave the pool a wave of families
    alone = ("env", "data", "bot_eager", "bot_auto", "bot_auto_warm")
    caps = acceptance.DEFAULT_CAPS
    assert sum(caps[p] for p in alone) + caps["family"] < acceptance.DEFAULT_BUDGET < 480


def test_compile_summary_is_the_last_line_and_may_be_absent(acceptance):
    parse = acceptance.parse_compile_summary
    first = {"mode": "reduce-overhead", "decision": "compiled", "reason": "", "compile_s": 50.0, "eager_step_s": 0.2,
             "compiled_step_s": 0.1, "recompiles": 0, "estimate": None}
    last = dict(first, decision="fell back", reason="the compiled step is slower", recompiles=2)
    text = (f"[11/27 10:00:00 reid_engine.runtime.compile_guard]: Compile summary: {json.dumps(first)}\n"
            f"iter: 19  total_loss: 3.2\n[11/27 10:00:09 x]: Compile summary: {json.dumps(last)}\nlater line\n")
    assert parse(text) == last
    assert parse("no summary here\n") is None and parse("Compile summary: {not json\n") is None
    cols = acceptance.compile_columns(parse(text))
    assert cols["speedup"] == pytest.approx(2.0) and cols["recompiles"] == 2
    assert cols["compile"] == "reduce-overhead: fell back (the compiled step is slower)"
    missing = acceptance.compile_columns(None)
    assert set(missing.values()) == {None}
    table = acceptance.format_table([{"part": "x", "status": "ok", **missing}])
    assert table.splitlines()[2].count("| -") == len(acceptance.COLUMNS) - 2, table


def test_a_run_folder_gives_speed_memory_and_map(acceptance, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text("\n".join(json.dumps(r) for r in [
        {"iteration": 0, "time": 9.0}, {"iteration": 1, "time": 0.1}, {"iteration": 2, "time": 0.3},
        {"iteration": 2, "SyntheticReID/mAP": 12.5}]) + "\n")
    (run / "config.yaml").write_text("SOLVER:\n  IMS_PER_BATCH: 64\nTEST:\n  IMS_PER_BATCH: 128\n")
    (run / "log.txt").write_text(
        "iter: 19  time: 0.1  max_mem: 812M\niter: 39  time: 0.1  max_mem: 9012M\n"
        "copypaste: Dataset,Rank-1,mAP\ncopypaste: SyntheticReID,40.00,12.50\n")
    part = acceptance.Part("bot", "train", run_dir=str(run))
    row = acceptance.summarize(part, "ok", 12.0, "")
    assert row["step_s"] == pytest.approx(0.3) and row["img_s"] == pytest.approx(64 / 0.3)
    assert row["peak_mb"] == 9012 and row["mAP"] == pytest.approx(12.5) and row["compile"] is None


def test_a_failed_part_notes_its_last_line_and_pytest_counts(acceptance):
    log = f"{acceptance.MARK}$ python x.py\na\nValueError: bad\n{acceptance.MARK}failed (exit 1)\n"
    row = acceptance.summarize(acceptance.Part("x", "fake"), "failed (exit 1)", 1.0, log)
    assert row["note"] == "ValueError: bad"
    log = "PASSED tests/a.py::t1\nFAILED tests/a.py::t2 - assert 0\n==== 1 failed, 1 passed, 3 skipped in 2.0s ====\n"
    assert acceptance.pytest_columns(acceptance.Part("t", "tests"), log)["note"] == (
        "1 failed, 1 passed, 3 skipped in 2.0s; failed: tests/a.py::t2")
    cut_off = "[gw0] [ 50%] PASSED tests/a.py::t1\n[gw1] [100%] FAILED tests/a.py::t2\n"  # killed before the summary
    assert acceptance.pytest_columns(acceptance.Part("t", "tests"), cut_off)["note"] == (
        "before the summary: 1 failed, 1 passed; failed: tests/a.py::t2")


def test_the_cuda_tests_are_found_by_their_skipif(acceptance):
    files = acceptance.cuda_test_files()
    assert "tests/engine/test_compile_cuda.py" in files and "tests/tools/test_gpu_acceptance.py" not in files


@pytest.mark.slow
def test_every_family_command_is_a_valid_config(acceptance, tmp_path):
    """The GPU runs' command lines (which the CPU cannot afford to run) merge onto their configs and
    pass the value checks and the LR schedule; their data set is the synthetic one."""
    from reid_engine.config import get_cfg
    from reid_engine.engine.config_checks import check_config_values
    from reid_engine.solver.lr_scheduler import build_lr_scheduler

    args = acceptance.build_parser().parse_args(_dirs(tmp_path))
    teacher = tmp_path / "work" / "kd_teacher"  # what --write-teacher writes first (the check reads the config)
    teacher.mkdir(parents=True)
    (teacher / "teacher.yml").write_text(f"_BASE_: {os.path.join(REPO_ROOT, acceptance.TEACHER_CONFIG)}\n")
    (teacher / "teacher.pth").write_bytes(b"")
    parts = [p for p in acceptance.build_parts(args) if p.kind == "train" and not p.skip]
    families = {"family:" + f.name for f in acceptance.FAMILIES if f is not acceptance.BOT}
    assert {p.name for p in parts} >= {"bot_eager", "bot_auto", *families}
    for part in parts:
        command = part.commands[-1]
        cfg = get_cfg()
        cfg.merge_from_file(command[command.index("--config-file") + 1])
        cfg.merge_from_list(command[command.index("--config-file") + 2:])
        check_config_values(cfg)
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.SOLVER.BASE_LR)
        build_lr_scheduler(cfg, optimizer, iters_per_epoch=59)
        assert cfg.DATASETS.NAMES[0].startswith("Synthetic") and not cfg.MODEL.BACKBONE.PRETRAIN, part.name


def test_the_kd_teacher_fits_the_training_set(acceptance, data_root, tmp_path):
    acceptance.write_teacher(str(tmp_path), data_root, tiny=True)
    state = torch.load(tmp_path / "teacher.pth", map_location="cpu", weights_only=True)["model"]
    assert state["heads.weight"].shape[0] == 24  # SyntheticReIDTiny's training identities
    assert "_BASE_" in (tmp_path / "teacher.yml").read_text()


@pytest.mark.slow
def test_tiny_parts_end_to_end_on_the_cpu(acceptance, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pooled = ("family:AGW_R50", "family:bagtricks_osnet_x1_0")  # two shared parts beside each other
    rc = acceptance.main(_dirs(tmp_path) + ["--device", "cpu", "--tiny", "--jobs", "2", "--parts", "data", "bot_eager",
                                            *pooled])
    assert rc == 0
    rows = {r["part"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["rows"]}
    assert rows["data"]["status"] == "ok", rows
    bot = rows["bot_eager"]
    assert bot["status"] == "ok", bot
    assert 0.0 <= bot["mAP"] <= 100.0 and bot["step_s"] > 0 and bot["img_s"] > 0 and bot["wall_s"] > 0
    assert bot["shared"] == 0 and [rows[p]["shared"] for p in pooled] == [1, 1], rows
    for name in pooled:
        assert rows[name]["status"] == "ok" and 0.0 <= rows[name]["mAP"] <= 100.0, rows[name]
    assert (tmp_path / "data" / "SyntheticVideoReIDTiny").is_dir()
    assert (tmp_path / "out" / "runs" / "bot_eager" / "log.txt").is_file()
    assert not list((tmp_path / "work").rglob("*.pth")), "checkpoints left behind"
    assert "| bot_eager " in capsys.readouterr().out  # the table (padded to the longest part name)
