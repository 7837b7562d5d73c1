"""A wrong value for an enumerated config key: one `error:` line, no traceback, OUTPUT_DIR untouched.

Every case runs the command's entry point (`reid_engine.cli.train.main`, the function behind
`tools/train_net.py`) in this process; one case also runs as a separate `tools/train_net.py`
process, to check the same through a real interpreter (stderr, exit status). The values are
checked before the run sets up its output folder or reads any data.
"""
import os

import pytest

from reid_engine.cli import train
from tests.conftest import run_cli
from tests.e2e.test_train_net import snapshot

CFG = os.path.join(os.path.dirname(__file__), "configs", "tiny_R18.yml")

# key, wrong value, what the error line must show besides the key
CASES = [
    ("SOLVER.SCHED", "Foo", "choose one of MultiStepLR, CosineAnnealingLR"),
    ("MODEL.BACKBONE.DEPTH", "7x", "choose one of 18x, 34x, 50x, 101x, 152x"),
    ("DATASETS.NAMES", "('Market15',)", "did you mean Market1501?"),
    ("DATASETS.TESTS", "('SyntheticReIDTin',)", "did you mean SyntheticReIDTiny?"),
    ("MODEL.LOSSES.NAME", "('CrossEntropy', 'TripletLoss')", "did you mean CrossEntropyLoss?"),
    ("SOLVER.OPT", "Adamm", "did you mean Adam?"),
    ("MODEL.HEADS.POOL_LAYER", "GeM", "choose one of AdaptiveAvgMaxPool"),
    ("DATALOADER.SAMPLER_TRAIN", "Naive", "did you mean NaiveIdentitySampler?"),
    ("MODEL.META_ARCHITECTURE", "Mgn", "did you mean MGN?"),
    ("MODEL.BACKBONE.NAME", "resnet", "did you mean build_resnet_backbone?"),
    # keys added with the fast-reid fidelity fixes
    ("TEST.NECK_FEAT", "middle", "choose one of before, after"),
    ("INPUT.REA.RATIO", "[3.3, 0.3]", "ratio must be [min, max] with 0 < min <= max"),
    ("SOLVER.CHECKPOINT_MAX_TO_KEEP", "-1", "must be >= 0, got -1: 0 keeps every periodic checkpoint"),
    # speed switches
    ("SOLVER.AMP.DTYPE", "fp8", "choose one of auto, float16"),
    ("MODEL.CHANNELS_LAST", "yes", "choose one of auto, on, off"),
    ("MODEL.COMPILE_SCOPE", "layers", "choose one of auto, model, blocks"),
    ("MODEL.COMPILE_WEIGH_COST", "maybe", "expects bool"),
    # fault handling
    ("DATALOADER.ON_BAD_IMAGE", "ignore", "choose one of error, skip"),
]

_EARLIER_FILES = {
    "config.yaml": b"# the config of an earlier run\nSEED: 1\n",
    "log.txt": b"an earlier run's log\n",
    "notes.txt": b"kept\n",
}


def _folder_state(folder):
    """({name: bytes}, {name: mtime_ns}) of every file directly in folder."""
    return snapshot(folder), {name: os.stat(os.path.join(folder, name)).st_mtime_ns
                              for name in os.listdir(folder)}


def _check_refused(exit_code, stderr, out, tmp_path, before, key, shows):
    assert exit_code == 2  # a wrong config value is a usage error
    assert "Traceback" not in stderr, stderr[-3000:]
    error_lines = [line for line in stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, stderr[-3000:]
    line = error_lines[0]
    assert key in line and shows in line, line
    assert _folder_state(out) == before, "OUTPUT_DIR was changed"
    assert not (tmp_path / "no_data").exists()  # no data was looked at or generated


@pytest.fixture()
def earlier_run(tmp_path):
    """An OUTPUT_DIR holding an earlier run's files, and its state."""
    out = tmp_path / "out"
    out.mkdir()
    for name, data in _EARLIER_FILES.items():
        (out / name).write_bytes(data)
    return out, _folder_state(out)


def _argv(tmp_path, out, key, value):
    return ["--config-file", CFG, "DATASETS.ROOT", str(tmp_path / "no_data"), "OUTPUT_DIR", str(out), key, value]


@pytest.mark.parametrize("key, value, shows", CASES, ids=[case[0] for case in CASES])
def test_wrong_value_is_one_error_line_and_keeps_output_dir(tmp_path, earlier_run, capsys, monkeypatch, key, value,
                                                            shows):
    monkeypatch.delenv("REID_DEBUG", raising=False)
    out, before = earlier_run
    exit_code = train.main(_argv(tmp_path, out, key, value))
    _check_refused(exit_code, capsys.readouterr().err, out, tmp_path, before, key, shows)


@pytest.mark.slow
def test_wrong_value_in_a_separate_process(tmp_path, earlier_run):
    out, before = earlier_run
    key, value, shows = CASES[0]
    proc = run_cli(_argv(tmp_path, out, key, value), timeout=120)
    _check_refused(proc.returncode, proc.stderr, out, tmp_path, before, key, shows)
