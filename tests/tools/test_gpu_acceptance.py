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


@pytest.fixture(scope="module")
def acceptance():
    """The script as a module (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dirs(tmp_path):
    return ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--data-root", str(tmp_path / "data")]


def _members(archive):
    """{name: text} of an archive's files."""
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


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


def test_parts_past_the_budget_are_skipped(acceptance, tmp_path):
    assert acceptance.main(_dirs(tmp_path) + ["--fake-part", f"a={PY} -c pass", "--parts", "a", "--budget", "0"]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert [(r["part"], r["status"], r["wall_s"]) for r in rows] == [("a", "skipped: budget", None)]
    assert not (tmp_path / "out" / "logs" / "a.log").exists()


@pytest.mark.parametrize("argv", [["--caps", "bot_auto"], ["--caps", "bot_auto=-3"], ["--parts", "no_such_part"],
                                  ["--fake-part", "nocommand"]])
def test_bad_arguments_exit_2(acceptance, tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        acceptance.main(_dirs(tmp_path) + argv)
    assert exc.value.code == 2


def test_caps_apply_to_a_part_or_its_group(acceptance):
    caps = acceptance.parse_caps(["family=33", "family:mars=44"])
    assert acceptance.cap_of("family:AGW_R50", caps) == 33 and acceptance.cap_of("family:mars", caps) == 44
    assert acceptance.cap_of("bot_auto", caps) == acceptance.DEFAULT_CAPS["bot_auto"]
    # the parts before the families fit 8 minutes with the data generation
    head = ("env", "data", "bot_eager", "bot_auto", "cuda_tests")
    assert sum(acceptance.DEFAULT_CAPS[p] for p in head) < acceptance.DEFAULT_BUDGET < 480


def test_compile_summary_is_the_last_line_and_may_be_absent(acceptance):
    parse = acceptance.parse_compile_summary
    first = {"mode": "reduce-overhead", "decision": "compiled", "reason": "", "compile_s": 50.0, "eager_step_s": 0.2,
             "compiled_step_s": 0.1, "recompiles": 0, "estimate": None}
    last = dict(first, decision="fell back", reason="the compiled step is slower", recompiles=2)
    text = (f"[11/27 10:00:00 reid_engine.engine.compile_guard]: Compile summary: {json.dumps(first)}\n"
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
    assert {p.name for p in parts} >= {"bot_eager", "bot_auto", *("family:" + f.name for f in acceptance.FAMILIES)}
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
    rc = acceptance.main(_dirs(tmp_path) + ["--device", "cpu", "--tiny", "--parts", "data", "bot_eager"])
    assert rc == 0
    rows = {r["part"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["rows"]}
    assert rows["data"]["status"] == "ok", rows
    bot = rows["bot_eager"]
    assert bot["status"] == "ok", bot
    assert 0.0 <= bot["mAP"] <= 100.0 and bot["step_s"] > 0 and bot["img_s"] > 0 and bot["wall_s"] > 0
    assert (tmp_path / "data" / "SyntheticVideoReIDTiny").is_dir()
    assert (tmp_path / "out" / "runs" / "bot_eager" / "log.txt").is_file()
    assert not list((tmp_path / "work").rglob("*.pth")), "checkpoints left behind"
    assert "| bot_eager |" in capsys.readouterr().out
