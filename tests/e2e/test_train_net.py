"""The product end to end: the real command line on real files (tiny synthetic data)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from reid_engine.evaluation import parse_csv_format
from tests.conftest import REPO_ROOT, run_cli

# Real command lines in fresh interpreters: seconds each, so the whole module is in the slow tier.
pytestmark = pytest.mark.slow

CFG = os.path.join(os.path.dirname(__file__), "configs", "tiny_R18.yml")
KILLER = os.path.join(os.path.dirname(__file__), "kill_during_save.py")
TIMING_KEYS = {"time", "data_time", "eta_seconds"}


def tiny_args(data_root, out, *extra):
    """The command-line arguments of a tiny run: tiny_R18.yml at a quarter width (3x faster than full width,
    8 MB checkpoints instead of 134 MB), then ``extra`` (which may set the width back)."""
    return ["--config-file", CFG, "DATASETS.ROOT", data_root, "OUTPUT_DIR", str(out),
            "MODEL.BACKBONE.WIDTH_MULT", "0.25", *extra]


def load_weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def metrics_by_iter(out):
    """metrics.json folded per iteration (later lines win), timing keys dropped."""
    merged = {}
    with open(os.path.join(out, "metrics.json")) as f:
        for line in f:
            rec = json.loads(line)
            it = rec.pop("iteration")
            merged.setdefault(it, {}).update({k: v for k, v in rec.items() if k not in TIMING_KEYS})
    return merged


def copypaste_results(text):
    """The last `copypaste:` results the evaluator printed (one dataset), as {name: value}."""
    results = parse_csv_format(text)
    assert len(results) == 1, text[-2000:]
    return next(iter(results.values()))


def snapshot(folder):
    """{relative path: bytes} of every file in a folder."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


@pytest.fixture(scope="module")
def finished_run(data_root, tmp_path_factory):
    """One complete uninterrupted tiny run (reused by several tests), started with --resume in an
    empty folder (a fresh start); removed with the module, as its checkpoints take several hundred MB."""
    out = tmp_path_factory.mktemp("run") / "out"
    proc = run_cli(["--resume"] + tiny_args(data_root, out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    yield str(out), proc
    shutil.rmtree(out.parent, ignore_errors=True)


def test_run_writes_all_outputs_and_learns_something(finished_run):
    out, proc = finished_run
    files = set(os.listdir(out))
    for name in ["config.yaml", "log.txt", "metrics.json", "model_final.pth", "model_best.pth", "last_checkpoint"]:
        assert name in files, files
    assert any(re.fullmatch(r"model_\d{7}\.pth", f) for f in files)
    assert any(f.startswith("events.out.tfevents") for f in files)
    with open(os.path.join(out, "last_checkpoint")) as f:
        assert f.read().strip() == "model_final.pth"
    log = open(os.path.join(out, "log.txt")).read()
    assert "eta: " in log and "Overall training speed" in log
    assert "starting from scratch" in log and "Starting training from iteration 0" in log  # --resume, no checkpoint
    results = copypaste_results(log)
    assert 0.0 <= results["mAP"] <= 100.0 and "Rank-1" in results
    metrics = metrics_by_iter(out)
    last = metrics[max(metrics)]
    assert any(k.endswith("/mAP") for k in last), last


def test_sigkill_at_any_moment_then_resume_is_bit_identical(finished_run, data_root, tmp_path):
    ref_out, _ = finished_run
    out = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
    # 1) SIGKILL in the middle of the 3rd checkpoint save (temp file complete, not renamed).
    proc = subprocess.run([sys.executable, KILLER, "3"] + tiny_args(data_root, out), env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not os.path.exists(out / "model_final.pth")
    # 2) resume with loader worker processes (the stream must not depend on them), and
    #    SIGKILL it from outside at an arbitrary moment once training is under way.
    cmd = [sys.executable, os.path.join(REPO_ROOT, "tools", "train_net.py"), "--resume"] + tiny_args(
        data_root, out, "DATALOADER.NUM_WORKERS", "2")
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    log = out / "log.txt"
    while time.time() < deadline and child.poll() is None:
        if log.exists() and log.read_text().count("Resuming") + log.read_text().count("resum") >= 2:
            break
        time.sleep(0.05)
    time.sleep(1.5)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    # 3) resume to the end.
    proc = run_cli(["--resume"] + tiny_args(data_root, out))
    assert proc.returncode == 0, proc.stderr[-4000:]

    ref, got = load_weights(os.path.join(ref_out, "model_final.pth")), load_weights(out / "model_final.pth")
    assert ref.keys() == got.keys()
    for k in ref:
        assert torch.equal(ref[k], got[k]), f"{k} differs after resume"
    ref_metrics, got_metrics = metrics_by_iter(ref_out), metrics_by_iter(str(out))
    assert ref_metrics == got_metrics


def test_two_cpu_workers_eval_only_matches_one_worker(finished_run, data_root, tmp_path):
    # Training with two workers (--num-gpus 2) runs in the fault tests (test_resume_world_size)
    # and across two "machines" below.
    weights = os.path.join(finished_run[0], "model_final.pth")
    one = run_cli(["--eval-only"] + tiny_args(data_root, tmp_path / "e1", "MODEL.WEIGHTS", weights))
    two = run_cli(["--eval-only", "--num-gpus", "2", "--dist-url", "auto"]
                  + tiny_args(data_root, tmp_path / "e2", "MODEL.WEIGHTS", weights))
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    r1 = copypaste_results(open(tmp_path / "e1" / "log.txt").read())
    r2 = copypaste_results(open(tmp_path / "e2" / "log.txt").read())
    assert r1 == r2


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_machines_on_localhost_train_together(data_root, tmp_path):
    url = f"tcp://127.0.0.1:{_free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)
    procs = []
    for rank in (0, 1):
        args = ["--num-machines", "2", "--machine-rank", str(rank), "--dist-url", url] + tiny_args(
            data_root, tmp_path / "m", "SOLVER.MAX_EPOCH", "1", "TEST.EVAL_PERIOD", "5")
        procs.append(subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "tools", "train_net.py")] + args,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    log = open(tmp_path / "m" / "log.txt").read()
    assert "World size: 2" in log and os.path.exists(tmp_path / "m" / "model_final.pth")
    assert os.path.exists(tmp_path / "m" / "log.txt.rank1")
    copypaste_results(log)  # the two evaluated together


# --------------------------------------------------------------------------- bad input
@pytest.fixture()
def populated_out(finished_run, tmp_path):
    """A copy of a finished run's output folder, to check nothing is lost. Checkpoints are
    hard links (they are only ever replaced by an atomic rename, never written in place),
    so each copy costs no disk space; the small text files are real copies."""
    out = tmp_path / "keep"
    shutil.copytree(finished_run[0], out, copy_function=_link_checkpoints_copy_the_rest)
    return out


def _link_checkpoints_copy_the_rest(src, dst):
    if src.endswith(".pth"):
        os.link(src, dst)
    else:
        shutil.copy2(src, dst)


USAGE_ERROR, RUN_FAILURE = 2, 1  # exit codes: bad flags / config keys or values; failures of the run


def _assert_one_line_error(proc, exit_code, *needles):
    assert proc.returncode == exit_code, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert lines, proc.stdout[-2000:]
    err = lines[-1]
    assert err.startswith("reid-train: error:"), proc.stderr[-3000:]
    assert [line for line in lines if "error:" in line] == [err], proc.stderr[-3000:]
    for n in needles:
        assert n in err, err
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _assert_kept(before, out):
    after = snapshot(out)
    for name, data in before.items():
        if name in ("log.txt", "metrics.json"):  # appended to, never rewritten
            assert after[name].startswith(data), f"{name} was truncated"
        elif name == "config.yaml":  # a new run's config may replace it; the old one is kept aside
            kept = [v for k, v in after.items() if re.fullmatch(r"config(\.[0-9-]+)?\.yaml", k)]
            assert data in kept, "the earlier config.yaml was lost"
        else:
            assert after.get(name) == data, f"{name} was lost or changed"


@pytest.mark.parametrize(
    "extra,exit_code,needles",
    [
        (["SOLVER.BASE_LRR", "0.1"], USAGE_ERROR, ["SOLVER.BASE_LRR", "SOLVER.BASE_LR"]),
        (["SOLVER.BASE_LR", "fast"], USAGE_ERROR, ["SOLVER.BASE_LR", "float", "fast"]),
        (["SOLVER.BASE_LR"], USAGE_ERROR, ["odd number"]),
        (["MODEL.DEVICE", "cuda"], RUN_FAILURE, ["MODEL.DEVICE"]),
        (["DATASETS.NAMES", "('Market1501',)"], RUN_FAILURE, ["Market-1501-v15.09.15"]),
        (["MODEL.WEIGHTS", "/nonexistent/model.pth"], RUN_FAILURE, ["/nonexistent/model.pth"]),
    ],
)
def test_bad_input_is_one_clear_line_and_keeps_outputs(populated_out, data_root, extra, exit_code, needles):
    if extra == ["MODEL.DEVICE", "cuda"] and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    before = snapshot(populated_out)
    proc = run_cli(tiny_args(data_root, populated_out, *extra))
    _assert_one_line_error(proc, exit_code, *needles)
    _assert_kept(before, populated_out)


def test_missing_config_file(tmp_path):
    proc = run_cli(["--config-file", str(tmp_path / "nope.yml")])
    _assert_one_line_error(proc, USAGE_ERROR, "nope.yml")


def test_weights_that_are_not_a_checkpoint(populated_out, data_root, tmp_path):
    bad = tmp_path / "notes.pth"
    bad.write_text("these are not weights")
    before = snapshot(populated_out)
    proc = run_cli(["--eval-only"] + tiny_args(data_root, populated_out, "MODEL.WEIGHTS", str(bad)))
    _assert_one_line_error(proc, RUN_FAILURE, str(bad))
    _assert_kept(before, populated_out)


def test_corrupt_image_names_its_path(data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(os.path.join(data_root, "SyntheticReIDTiny"), root / "SyntheticReIDTiny")
    train_dir = root / "SyntheticReIDTiny" / "bounding_box_train"
    victim = sorted(os.listdir(train_dir))[0]
    (train_dir / victim).write_bytes(b"\xff\xd8 definitely not a jpeg")
    proc = run_cli(tiny_args(str(root), tmp_path / "out", "DATALOADER.SAMPLER_TRAIN", "TrainingSampler",
                             "SOLVER.MAX_EPOCH", "1"))
    _assert_one_line_error(proc, RUN_FAILURE, victim)


def test_nan_loss_names_iteration_and_keeps_last_checkpoint(populated_out, data_root):
    before = snapshot(populated_out)
    # Resume past the end with a broken normalisation: the first new step is non-finite.
    proc = run_cli(["--resume"] + tiny_args(data_root, populated_out, "SOLVER.MAX_EPOCH", "4",
                                            "MODEL.PIXEL_STD", "[1e-38, 1e-38, 1e-38]"))
    _assert_one_line_error(proc, RUN_FAILURE, "iteration")
    _assert_kept(before, populated_out)
    with open(populated_out / "last_checkpoint") as f:
        assert f.read().strip() == "model_final.pth"
