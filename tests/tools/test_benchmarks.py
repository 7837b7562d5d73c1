"""Smoke runs of the benchmark scripts, so that a change of the engine cannot break them unnoticed."""
import os
import sys

import pytest

from tests.conftest import REPO_ROOT

BENCHMARKS = os.path.join(REPO_ROOT, "tools", "benchmarks")
#: the scripts (harness.py and families.py are the modules they share)
SCRIPTS = sorted(name[:-3] for name in os.listdir(BENCHMARKS) if name.endswith(".py") and name not in (
    "harness.py", "families.py"))


@pytest.fixture
def bench_module(monkeypatch):
    """Import a benchmark script as its own folder would (it imports its neighbours by name)."""
    monkeypatch.syspath_prepend(BENCHMARKS)

    def load(name):
        monkeypatch.delitem(sys.modules, name, raising=False)
        return __import__(name)
    return load


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_answers_help(bench_module, monkeypatch, capsys, name):
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as exc:
        bench_module(name).main()
    assert exc.value.code == 0 and capsys.readouterr().out.startswith(f"usage: {name}.py"), name


@pytest.mark.slow
def test_bench_train_gpu_runs_the_trainer_loop_on_the_cpu(bench_module, data_root, capsys):
    bench = bench_module("bench_train_gpu")
    bench.main(["--device", "cpu", "--depth", "18x", "--size", "32", "16", "--batch", "8", "--iters", "2",
                "--warmup", "1", "--variants", "fp32", "--workers", "0", "--skip-loader",
                "--data-root", data_root, "--dataset", "SyntheticReIDTiny"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| fp32 |"))
    model_ips, trainer_ips = float(row.split("|")[2]), float(row.split("|")[4])
    assert model_ips > 0 and trainer_ips > 0, out


def test_bench_train_gpu_variants_name_their_compile_mode(bench_module):
    bench = bench_module("bench_train_gpu")
    mode = bench.variant_compile_mode
    assert mode("bf16+cl".split("+")) == "off" and mode("bf16+cl+compile".split("+")) == "default"
    assert mode("bf16+cl+compile:reduce-overhead".split("+")) == "reduce-overhead"
    assert mode("fp32+compile:max-autotune".split("+")) == "max-autotune" and mode("bf16+auto".split("+")) == "auto"
    with pytest.raises(SystemExit, match="more than one compile mode"):
        mode("bf16+auto+compile".split("+"))


def test_bench_train_loader_compares_augmentation_placements_and_the_image_cache(bench_module, data_root, capsys):
    bench = bench_module("bench_train_loader")
    bench.main(["--config", os.path.join(REPO_ROOT, "tests", "e2e", "configs", "tiny_R18.yml"), "--data-root", data_root,
                "--images", "32", "--batches", "1", "--rounds", "1", "--workers", "0"])
    out = capsys.readouterr().out
    assert "batch ops on cpu (main process)" in out and "cached image + augment, per image" in out, out
    rows = {tuple(line.split()[:3]): line.split() for line in out.splitlines() if line.split()[:1] == ["0"]}
    assert set(rows) == {("0", cache, placement) for cache in ("off", "on") for placement in ("per", "batched")}, out
    assert float(rows["0", "off", "per"][4]) > 0 and rows["0", "off", "batched"][-1].endswith("x"), out
    assert rows["0", "on", "per"][-1].endswith("x") and rows["0", "on", "batched"][-2].endswith("x"), out


@pytest.mark.slow
def test_bench_clustering_prints_time_memory_and_quality(bench_module, capsys):
    bench = bench_module("bench_clustering")
    bench.main(["--num", "400", "--ids", "16", "--dim", "32", "--threads", "1"])
    out = capsys.readouterr().out
    for figure in ("jaccard_distance_graph", "dbscan_pseudo_labels", "total:", "peak RSS", "NMI"):
        assert figure in out, out


def test_bench_cpu_bf16_conv_times_the_shapes_and_the_whole_step(bench_module, capsys, monkeypatch):
    monkeypatch.setattr("reid_engine.modeling.meta_arch.build.log_model_summary", lambda *a, **k: None)
    bench = bench_module("bench_cpu_bf16_conv")
    bench.main(["--size", "32", "16", "--batch", "4", "--classes", "2", "--repeats", "1", "--rounds", "1",
                "--steps", "1", "--warmup", "0", "--shapes", "8"])
    out = capsys.readouterr().out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ") and "ms" not in line]
    assert len(rows) == 8, out
    used = {row[1].strip(): row[5].strip() for row in rows}
    assert used["256, 6x3, 256, 3x3, 1"] == "yes" and used["32, 24x12, 32, 3x3, 1"] == "no", out
    speedup = out.split("speed-up ")[1].split("x")[0]
    assert float(speedup) > 0 and "convolutions converted" in out, out


def test_bench_shared_cores_places_the_run_on_pinned_cores_or_a_quota_group(bench_module, tmp_path):
    bench = bench_module("bench_shared_cores")
    assert bench._placer("machine", "") is None
    pin = bench._placer("pin:1", "")
    before = os.sched_getaffinity(0)
    try:
        pin()
        assert os.sched_getaffinity(0) == {sorted(before)[0]}
    finally:
        os.sched_setaffinity(0, before)
    procs = tmp_path / "cgroup.procs"
    bench._placer("quota:1", str(tmp_path))()  # a fake group folder: the pid lands in its procs file
    assert procs.read_text() == str(os.getpid())
    with pytest.raises(SystemExit, match="unknown placement"):
        bench._placer("cores:2", "")
