"""A worker's traceback read back as the user error it ends with (the command line and reid-tune share it)."""
from reid_engine.config import ConfigError
from reid_engine.utils.errors import user_error_of_traceback

TRACEBACK = "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n{}\n"


def test_a_user_error_gives_its_class_and_one_line_message():
    text = TRACEBACK.format("reid_engine.config.config.ConfigError: bad value (SOME.KEY): set it to 1")
    assert user_error_of_traceback(text) == (ConfigError, "bad value (SOME.KEY): set it to 1")


def test_anything_else_is_none():
    for last in ("ValueError: a bug", "torch.OutOfMemoryError: no memory", "no.such.module.Error: x",
                 "reid_engine.config.config.NoSuchClass: x", "not an exception line"):
        assert user_error_of_traceback(TRACEBACK.format(last)) is None, last
    assert user_error_of_traceback("") is None
