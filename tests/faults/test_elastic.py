"""Auto-resume under torchelastic: on when torchrun (or any torchelastic agent) started the run, off
with --no-auto-resume. (A stopped 2-worker run started again under a real torchrun resumes by itself
from its last checkpoint, exactly: tests/faults/test_resume_world_size.py; SIGKILL at any moment then an
exact resume: tests/e2e/test_train_net.py.)"""
import pytest


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
