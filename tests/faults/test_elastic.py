"""torchrun --max-restarts: a worker killed mid-run, torchrun restarts the group, the group resumes from
the last checkpoint by itself (auto-resume under torchelastic) and ends with the uninterrupted result."""
import os
import sys

import pytest

from tests.faults._jobs import assert_same_run, finish, job_args, read, run, start

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2"]


@pytest.mark.slow
def test_killed_worker_is_restarted_and_the_run_ends_as_if_uninterrupted(data_root, tmp_path):
    ref, out = str(tmp_path / "ref"), str(tmp_path / "out")
    reference = start(["--num-gpus", "2", "--dist-url", "auto"] + job_args(data_root, ref))
    # Rank 1 SIGKILLs itself at iteration 12 of the first attempt, after the checkpoint of iteration 8.
    rc, _, err = run(job_args(data_root, out), launcher=TORCHRUN + ["--max-restarts", "1"],
                     REID_TEST_SIGNAL_AT="1:12:SIGKILL")
    assert rc == 0, err[-4000:]
    ref_rc, _, ref_err = finish(reference)
    assert ref_rc == 0, ref_err[-3000:]
    assert "exitcode: -9" in err or "SIGKILL" in err, err[-3000:]  # torchrun saw the worker die
    log = read(os.path.join(out, "log.txt"))
    assert "Auto-resume (launched by torchelastic)" in log
    assert "Resuming from " + os.path.join(out, "model_0000008.pth") in log
    assert "Starting training from iteration 9" in log
    assert read(os.path.join(out, "last_checkpoint")).strip() == "model_final.pth"
    assert_same_run(ref, out)


@pytest.mark.parametrize("argv, env, expected", [
    ([], {}, False),
    (["--resume"], {}, True),
    (["--auto-resume"], {}, True),
    ([], {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "0"}, True),
    (["--no-auto-resume"], {"TORCHELASTIC_RUN_ID": "job"}, False),
])
def test_auto_resume_is_on_under_torchelastic(monkeypatch, argv, env, expected):
    from reid_engine.cli.train import _resume_wanted, build_parser

    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _resume_wanted(build_parser().parse_args(argv)) is expected
