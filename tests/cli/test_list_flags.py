"""Flags with several values take a comma list or are repeated, so the KEY VALUE overrides after them stay overrides."""
import argparse

import pytest

from reid_engine.cli import export, visualize
from reid_engine.cli.args import comma_list


@pytest.mark.parametrize("argv, formats", [
    (["--format", "openvino", "MODEL.WEIGHTS", "m.pth"], ["openvino"]),
    (["--format", "onnx,openvino", "MODEL.WEIGHTS", "m.pth"], ["onnx", "openvino"]),
    (["--format", "onnx", "--format", "boxmot", "MODEL.WEIGHTS", "m.pth"], ["onnx", "boxmot"]),
])
def test_export_format_leaves_the_overrides_after_it(argv, formats):
    args = export.build_parser().parse_args(["--config-file", "x.yml", "--output", "out/", *argv])
    assert args.format == formats
    assert args.opts == ["MODEL.WEIGHTS", "m.pth"]


def test_export_format_defaults_and_repeats_are_resolved_once(tmp_path):
    args = export.build_parser().parse_args(["--inspect", "f.onnx"])
    assert args.format is None  # run() fills in the defaults, so --help shows no list to extend
    parsed = export.build_parser().parse_args(["--format", "onnx,onnx", "--format", "onnx"])
    assert parsed.format == ["onnx", "onnx", "onnx"]  # run() keeps each format once, in order


def test_export_unknown_format_is_one_error_line(tmp_path, capsys):
    assert export.main(["--output", str(tmp_path), "--format", "onnx,tflite", "MODEL.WEIGHTS", "m.pth"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "invalid format 'onnx,tflite'" in lines[0] and "boxmot" in lines[0], err
    assert "Traceback" not in err


def test_visualize_query_index_takes_a_comma_list_before_the_overrides():
    args = visualize.build_parser().parse_args(["--output", "vis/", "--query-index", "0,17", "--query-index", "42",
                                                "MODEL.WEIGHTS", "m.pth"])
    assert args.query_index == [0, 17, 42] and args.opts == ["MODEL.WEIGHTS", "m.pth"]


def test_comma_list_converts_and_refuses():
    assert comma_list(int)("3, 4") == [3, 4]
    for bad in ("", "x", "3,y"):
        with pytest.raises(argparse.ArgumentTypeError):
            comma_list(int, what="index")(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="of a, b"):
        comma_list(choices=("a", "b"))("c")
