"""Each command's parser accepts only the flags the command honours (others: exit 2, one error line)."""
import pytest

from reid_engine.cli import export, extract, make_synthetic, train, visualize


def _rejects(command, argv, flag, capsys):
    assert command.main(argv) == 2
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.rstrip().endswith(error_lines[0]), err
    assert error_lines[0].startswith(f"{command.PROG}: error: unrecognized arguments: {flag}"), err
    assert "Traceback" not in err


@pytest.mark.parametrize("flag", ["--resume", "--eval-only", "--num-gpus 2"])
def test_export_rejects_training_and_launch_flags(flag, tmp_path, capsys):
    _rejects(export, ["--output", str(tmp_path), *flag.split()], flag.split()[0], capsys)


@pytest.mark.parametrize("flag", ["--resume", "--eval-only", "--num-gpus 2"])
def test_visualize_rejects_training_and_launch_flags(flag, tmp_path, capsys):
    _rejects(visualize, ["--output", str(tmp_path), *flag.split()], flag.split()[0], capsys)


@pytest.mark.parametrize("flag", ["--resume", "--eval-only", "--opset 17"])
def test_extract_rejects_training_and_export_flags(flag, tmp_path, capsys):
    argv = ["--output", str(tmp_path / "f.npz"), "--split", "query", *flag.split()]
    _rejects(extract, argv, flag.split()[0], capsys)


@pytest.mark.parametrize("flag", ["--output out", "--split query", "--format onnx"])
def test_train_rejects_tool_flags(flag, capsys):
    _rejects(train, flag.split(), flag.split()[0], capsys)


@pytest.mark.parametrize("flag", ["--config-file x.yml", "--resume", "--num-gpus 2"])
def test_make_synthetic_rejects_config_and_launch_flags(flag, capsys):
    _rejects(make_synthetic, ["--no-write", *flag.split()], flag.split()[0], capsys)


def test_launch_flags_must_be_positive(capsys):
    assert train.main(["--num-gpus", "0"]) == 2
    assert "argument --num-gpus: must be at least 1, got 0" in capsys.readouterr().err


def test_default_argument_parser_is_still_importable_from_engine():
    from reid_engine.cli.args import default_argument_parser
    from reid_engine.engine import default_argument_parser as from_engine  # detectron2-style scripts

    assert from_engine is default_argument_parser
    args = from_engine().parse_args(["--config-file", "x.yml", "--num-gpus", "2", "--resume", "MODEL.DEVICE", "cpu"])
    assert (args.config_file, args.num_gpus, args.resume, args.opts) == ("x.yml", 2, True, ["MODEL.DEVICE", "cpu"])
