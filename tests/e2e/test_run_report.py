"""What a run shows: early progress lines, the summary block, ranks.png (TEST.RANK_VIS)."""
import logging
import os
import re
import shlex

import pytest
from PIL import Image

from reid_engine.data.synthetic import TINY_SPEC, ensure_synthetic_reid
from reid_engine.data.synthetic import generator as generator_module
from reid_engine.inference.rank_figures import rank_figure_size
from tests.conftest import REPO_ROOT, run_cli
from tests.e2e.test_train_net import copypaste_results, metrics_by_iter, tiny_args

# Real command lines in fresh interpreters: seconds each, so the whole module is in the slow tier.
pytestmark = pytest.mark.slow

NO_MATPLOTLIB_LINE = "TEST.RANK_VIS: matplotlib is not installed; ranks.png skipped (pip install matplotlib)"


def summary_block(text):
    """The lines of the summary block (from 'Run summary' to the end of the output)."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line.endswith("Run summary"))
    return lines[start:]


def test_summary_shows_final_metrics_files_and_commands(vis_run, data_root):
    out, console, log = vis_run
    block = summary_block(log)
    assert summary_block(console) == block  # the console shows the same block
    text = "\n".join(block)
    final = copypaste_results(log)
    row = next(line for line in block if line.strip().startswith("SyntheticReIDTiny:"))
    for name in ("Rank-1", "Rank-5", "Rank-10", "mAP", "mINP"):
        assert f"{name} {final[name]:.2f}" in row, row
    for name in ("model_final.pth", "last_checkpoint", "log.txt", "metrics.json", "ranks.png"):
        assert os.path.join(out, name) in text, text
    tb = re.search(r"tensorboard:\s+(\S+)", text).group(1)
    assert os.path.basename(tb).startswith("events.out.tfevents") and os.path.isfile(tb)
    assert "not written" not in text

    eval_cmd = shlex.split(block[block.index(next(x for x in block if "Evaluate the final" in x)) + 1])
    resume_cmd = shlex.split(block[block.index(next(x for x in block if "Continue training" in x)) + 1])
    assert eval_cmd[0] == "python" and eval_cmd[1].endswith(os.path.join("tools", "train_net.py")), eval_cmd
    args = eval_cmd[2:]
    assert args[:3] == ["--config-file", tiny_args(data_root, out)[1], "--eval-only"]
    pairs = dict(zip(args[3::2], args[4::2]))
    assert pairs["MODEL.WEIGHTS"] == os.path.join(out, "model_final.pth")
    assert pairs["DATASETS.ROOT"] == data_root and pairs["OUTPUT_DIR"] == os.path.join(out, "eval")
    assert pairs["TEST.RANK_VIS"] == "True"
    rargs = resume_cmd[2:]
    assert "--resume" in rargs
    rpairs = dict(zip(rargs[3::2], rargs[4::2]))
    assert rpairs["OUTPUT_DIR"] == out and rpairs["SOLVER.MAX_EPOCH"] == "2", rargs


def test_ranks_png_is_written_after_the_final_evaluation(vis_run):
    out, _, log = vis_run
    path = os.path.join(out, "ranks.png")
    assert os.path.getsize(path) > 50_000
    with Image.open(path) as img:
        width, height = img.size
    one_row_width, one_row_height = rank_figure_size(10)
    assert width == one_row_width and height > 4 * one_row_height  # 6 query rows of top-10
    assert log.count("TEST.RANK_VIS: wrote") == 1  # the final evaluation only, not the periodic ones


def test_first_eta_line_comes_after_the_timer_warmup(vis_run):
    out, _, log = vis_run
    eta_lines = [line for line in log.splitlines() if "eta: " in line]
    assert "iter: 3 " in eta_lines[0] and "total_loss" in eta_lines[0], eta_lines
    assert {3, 8} <= set(metrics_by_iter(out))  # metrics.json has the same early record
    assert "total_loss" in metrics_by_iter(out)[3]


def test_model_building_logs_progress(vis_run):
    _, _, log = vis_run
    assert "Building model Baseline (backbone build_resnet_backbone, depth 18x) ..." in log
    assert re.search(r"Built Baseline on cpu in \d+\.\d s", log)


def test_eval_command_without_matplotlib_skips_the_picture_with_one_line(vis_run, tmp_path):
    """The summary's evaluation command, run where matplotlib cannot be imported."""
    out, _, log = vis_run
    block = summary_block(log)
    eval_cmd = shlex.split(block[block.index(next(x for x in block if "Evaluate the final" in x)) + 1])
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None  # import fails\n")
    proc = run_cli(eval_cmd[2:], env={"PYTHONPATH": os.pathsep.join([str(blocker), REPO_ROOT])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    eval_log = open(os.path.join(out, "eval", "log.txt")).read()
    rank_vis_lines = [line for line in eval_log.splitlines() if "TEST.RANK_VIS:" in line]
    assert len(rank_vis_lines) == 1 and rank_vis_lines[0].endswith(NO_MATPLOTLIB_LINE), rank_vis_lines
    assert not os.path.exists(os.path.join(out, "eval", "ranks.png"))
    assert copypaste_results(eval_log) == copypaste_results(log)


def test_resuming_a_completed_run_prints_no_summary(vis_run, data_root):
    out, _, _ = vis_run
    proc = run_cli(["--resume"] + tiny_args(data_root, out, "SOLVER.MAX_EPOCH", "1", "TEST.EVAL_PERIOD", "5"))
    assert proc.returncode != 0
    assert "nothing to train" in proc.stderr and "Run summary" not in proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # one line that says what to do, no traceback
    assert last.startswith("reid-train: error: nothing to train") and "already complete" in last, proc.stderr[-2000:]
    assert "SOLVER.MAX_EPOCH" in last and "--eval-only" in last and "Traceback" not in proc.stderr


def test_generation_logs_progress(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(generator_module, "PROGRESS_SECONDS", 0.0)  # a line per image
    with caplog.at_level(logging.INFO, logger="reid_engine"):
        ensure_synthetic_reid(str(tmp_path), "SyntheticReIDTiny", TINY_SPEC)
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("synthetic.generator")]
    label = f"Generating SyntheticReIDTiny under {tmp_path}"
    total = len(generator_module.SyntheticWorld(TINY_SPEC).plan)
    assert lines[0].startswith(f"{label}: {total} images")
    assert any(line.startswith(f"{label}: 100 / {total} images (") for line in lines)
    assert lines[-1].startswith(f"{label}: {total} / {total} images (")
