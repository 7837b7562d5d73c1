"""setup_logger files/handlers per rank, and the rate-limited logging helpers."""
import logging

import pytest

from reid_engine.utils.logger import HIGHLIGHT, log_every_n, log_every_n_seconds, log_first_n, setup_logger


@pytest.fixture
def fresh_logger():
    """A logger name unique to the test, cleaned up afterwards."""
    names = []

    def make(name):
        names.append(name)
        return name

    yield make
    for name in names:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


def _flush(logger):
    for handler in logger.handlers:
        handler.flush()


def test_rank0_console_and_file(tmp_path, fresh_logger, capsys):
    name = fresh_logger("test_logger_rank0")
    logger = setup_logger(str(tmp_path), 0, name=name, color=False)
    logger.info("hello from rank 0")
    logging.getLogger(name + ".child").warning("careful")
    _flush(logger)
    text = (tmp_path / "log.txt").read_text()
    assert "hello from rank 0" in text and "WARNING: careful" in text and name + ".child" in text
    assert "hello from rank 0" in capsys.readouterr().out


def test_other_rank_file_only(tmp_path, fresh_logger):
    name = fresh_logger("test_logger_rank2")
    logger = setup_logger(str(tmp_path), 2, name=name)
    logger.info("from rank 2")
    _flush(logger)
    assert "from rank 2" in (tmp_path / "log.txt.rank2").read_text()
    assert not (tmp_path / "log.txt").exists()
    assert [type(h) for h in logger.handlers] == [logging.StreamHandler]
    assert logger.handlers[0].stream.name.endswith("log.txt.rank2")


def test_explicit_file_path_and_idempotent(tmp_path, fresh_logger):
    name = fresh_logger("test_logger_idem")
    path = str(tmp_path / "sub" / "train.log")
    setup_logger(path, name=name)
    logger = setup_logger(path, name=name)
    assert len(logger.handlers) == 2  # one console, one file: not duplicated
    logger.info("once")
    _flush(logger)
    assert open(path).read().count("once") == 1
    assert logger.propagate is False


def test_colored_console_highlights_warnings(fresh_logger, capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # termcolor colors only terminals otherwise
    monkeypatch.delenv("NO_COLOR", raising=False)
    name = fresh_logger("test_logger_color")
    setup_logger(None, name=name, color=True, abbrev_name="tl")
    logging.getLogger(name + ".sub").warning("watch out")
    out = capsys.readouterr().out
    assert "WARNING" in out and "\x1b[" in out and "tl.sub" in out and "watch out" in out


def test_log_files_stay_plain_while_the_console_is_colored(tmp_path, fresh_logger, capsys, monkeypatch):
    """Highlighted config dumps and colored warnings reach a color console, never the log files."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    name = fresh_logger("test_logger_plain_files")
    logger = setup_logger(str(tmp_path), 0, name=name, color=True)
    setup_logger(str(tmp_path), 1, name=name + "_rank1", color=True)
    fresh_logger(name + "_rank1")
    dump = "MODEL:\n  DEVICE: cpu\nSOLVER:\n  BASE_LR: 0.01"
    logger.info("Running with full config:\n" + dump, extra={HIGHLIGHT: "yaml"})
    logger.warning("careful")
    logging.getLogger(name + "_rank1").info("Full config:\n" + dump, extra={HIGHLIGHT: "yaml"})
    _flush(logger)
    _flush(logging.getLogger(name + "_rank1"))
    out = capsys.readouterr().out
    assert "\x1b[" in out and "BASE_LR" in out  # the terminal gets color
    for log_file in ("log.txt", "log.txt.rank1"):
        text = (tmp_path / log_file).read_text()
        assert "\x1b" not in text, text
    assert "Running with full config:\n" + dump in (tmp_path / "log.txt").read_text()


def test_default_setup_writes_plain_log_files(tmp_path, monkeypatch, capsys):
    """The real run setup (config file contents + full config dump) under a color terminal."""
    import argparse

    from reid_engine.config import get_cfg
    from reid_engine.engine.defaults import default_setup

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    config_file = tmp_path / "x.yml"
    config_file.write_text("SOLVER:\n  BASE_LR: 0.02\n")
    cfg = get_cfg()
    cfg.merge_from_file(str(config_file))
    cfg.OUTPUT_DIR = str(tmp_path / "out")
    cfg.MODEL.DEVICE = "cpu"
    default_setup(cfg, argparse.Namespace(config_file=str(config_file), eval_only=False, resume=False))
    for handler in logging.getLogger("reid_engine").handlers:
        handler.flush()
    text = (tmp_path / "out" / "log.txt").read_text()
    assert "Running with full config:" in text and "BASE_LR: 0.02" in text
    assert "\x1b" not in text
    assert "\x1b[" in capsys.readouterr().out


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def collected(fresh_logger):
    name = fresh_logger("test_logger_rate")
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    handler = _Collect()
    logger.addHandler(handler)
    return name, handler


def test_log_first_n_and_every_n(collected):
    name, handler = collected
    for i in range(5):
        log_first_n(logging.INFO, f"first {i}", n=2, name=name)
    for i in range(7):
        log_every_n(logging.INFO, f"every {i}", n=3, name=name)
    for i in range(3):
        log_first_n(logging.INFO, "same message", n=1, name=name, key="message")
        log_first_n(logging.INFO, "same message", n=1, name=name, key="message")
    assert handler.messages == ["first 0", "first 1", "every 0", "every 3", "every 6", "same message"]
    with pytest.raises(ValueError, match="key"):
        log_first_n(logging.INFO, "x", key="bogus")


def test_log_every_n_seconds(collected, monkeypatch):
    name, handler = collected
    clock = [1000.0]
    monkeypatch.setattr("reid_engine.utils.logger.time.time", lambda: clock[0])
    for step in range(6):
        log_every_n_seconds(logging.INFO, f"tick {step}", n=2, name=name)
        clock[0] += 1.0
    assert handler.messages == ["tick 0", "tick 2", "tick 4"]


def test_default_name_is_the_package_root():
    logger = logging.getLogger("reid_engine")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    try:
        assert setup_logger(color=False) is logger
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)
        for h in saved[0]:
            logger.addHandler(h)
        logger.propagate, logger.level = saved[1], saved[2]
