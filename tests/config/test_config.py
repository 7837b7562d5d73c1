"""Config: defaults, _BASE_ chains, overrides and the errors users hit."""
import pytest
import yaml

from reid_engine.config import ConfigError, get_cfg


def _write(path, data):
    path.write_text(yaml.safe_dump(data) if isinstance(data, dict) else data)
    return str(path)


def test_defaults_cover_schema_keys():
    cfg = get_cfg()
    assert cfg.MODEL.DEVICE == "auto"
    assert cfg.MODEL.LOSSES.NAME == ("CrossEntropyLoss",)
    assert cfg.MODEL.LOSSES.TRI.MARGIN == 0.3
    assert cfg.INPUT.REA.VALUE == [123.675, 116.28, 103.53]
    assert cfg.SOLVER.STEPS == [30, 55] and cfg.SOLVER.WARMUP_ITERS == 1000
    assert cfg.TEST.RERANK.K1 == 20 and cfg.TEST.AQE.QE_K == 5
    assert cfg.KD.EMA.MOMENTUM == 0.999 and cfg.SEED == -1
    assert get_cfg() is not cfg and get_cfg().SOLVER.BASE_LR == 3e-4


def test_base_chain_string_and_list(tmp_path):
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "a.yml", {"SOLVER": {"BASE_LR": 0.1, "MAX_EPOCH": 7}, "OUTPUT_DIR": "a"})
    _write(tmp_path / "b.yml", {"SOLVER": {"BASE_LR": 0.2}, "TEST": {"EVAL_PERIOD": 3}})
    _write(tmp_path / "sub" / "mid.yml", {"_BASE_": "../a.yml", "OUTPUT_DIR": "mid"})
    child = _write(tmp_path / "sub" / "child.yml", {"_BASE_": ["mid.yml", str(tmp_path / "b.yml")],
                                                     "DATASETS": {"NAMES": '("Market1501", "DukeMTMC")'}})
    cfg = get_cfg()
    cfg.merge_from_file(child)
    assert cfg.SOLVER.BASE_LR == 0.2  # later base wins over earlier
    assert cfg.SOLVER.MAX_EPOCH == 7 and cfg.OUTPUT_DIR == "mid" and cfg.TEST.EVAL_PERIOD == 3
    assert cfg.DATASETS.NAMES == ("Market1501", "DukeMTMC")


def test_child_wins_over_base(tmp_path):
    _write(tmp_path / "base.yml", {"MODEL": {"BACKBONE": {"DEPTH": "101x"}}})
    child = _write(tmp_path / "c.yml", {"_BASE_": "base.yml", "MODEL": {"BACKBONE": {"DEPTH": "18x"}}})
    cfg = get_cfg()
    cfg.merge_from_file(child)
    assert cfg.MODEL.BACKBONE.DEPTH == "18x"


def test_unknown_key_in_file_suggests(tmp_path):
    f = _write(tmp_path / "x.yml", {"SOLVER": {"BASE_LRR": 0.1}})
    with pytest.raises(ConfigError) as e:
        get_cfg().merge_from_file(f)
    msg = str(e.value)
    assert "SOLVER.BASE_LRR" in msg and "SOLVER.BASE_LR" in msg and "x.yml" in msg
    assert "\n" not in msg


def test_unknown_key_on_command_line_suggests():
    with pytest.raises(ConfigError, match=r"MODEL.BACKBONE.DEPHT.*Did you mean: MODEL.BACKBONE.DEPTH"):
        get_cfg().merge_from_list(["MODEL.BACKBONE.DEPHT", "18x"])


def test_wrong_type_names_key_expected_and_got():
    with pytest.raises(ConfigError) as e:
        get_cfg().merge_from_list(["SOLVER.BASE_LR", "fast"])
    msg = str(e.value)
    assert "SOLVER.BASE_LR" in msg and "float" in msg and "'fast'" in msg


def test_wrong_type_in_file(tmp_path):
    f = _write(tmp_path / "t.yml", {"SOLVER": {"MAX_EPOCH": "many"}})
    with pytest.raises(ConfigError, match="SOLVER.MAX_EPOCH expects int"):
        get_cfg().merge_from_file(f)


def test_odd_number_of_override_tokens():
    with pytest.raises(ConfigError, match="odd number"):
        get_cfg().merge_from_list(["SOLVER.BASE_LR", "0.1", "SEED"])


def test_missing_config_file_and_missing_base(tmp_path):
    with pytest.raises(ConfigError, match="Config file not found"):
        get_cfg().merge_from_file(str(tmp_path / "nope.yml"))
    f = _write(tmp_path / "c.yml", {"_BASE_": "gone.yml"})
    with pytest.raises(ConfigError, match="gone.yml"):
        get_cfg().merge_from_file(f)


def test_base_cycle_is_an_error(tmp_path):
    _write(tmp_path / "a.yml", {"_BASE_": "b.yml"})
    _write(tmp_path / "b.yml", {"_BASE_": "a.yml"})
    with pytest.raises(ConfigError, match="cycle"):
        get_cfg().merge_from_file(str(tmp_path / "a.yml"))


def test_unsafe_yaml_is_refused(tmp_path):
    f = _write(tmp_path / "evil.yml", "SEED: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        get_cfg().merge_from_file(f)


def test_override_coercions():
    cfg = get_cfg()
    cfg.merge_from_list(["SOLVER.BASE_LR", "1", "SOLVER.MAX_EPOCH", "3.0", "SOLVER.STEPS", "(5, 8)",
                         "DATASETS.NAMES", "SyntheticReID", "MODEL.FREEZE_LAYERS", "['backbone']"])
    assert cfg.SOLVER.BASE_LR == 1.0 and isinstance(cfg.SOLVER.BASE_LR, float)
    assert cfg.SOLVER.MAX_EPOCH == 3 and isinstance(cfg.SOLVER.MAX_EPOCH, int)
    assert cfg.SOLVER.STEPS == [5, 8]
    assert cfg.DATASETS.NAMES == ("SyntheticReID",)
    assert cfg.MODEL.FREEZE_LAYERS == ["backbone"]
    with pytest.raises(ConfigError, match="SOLVER.MAX_EPOCH"):
        cfg.merge_from_list(["SOLVER.MAX_EPOCH", "2.5"])


def test_section_override_is_an_error():
    with pytest.raises(ConfigError, match="is a section"):
        get_cfg().merge_from_list(["SOLVER.AMP", "True"])


def test_dump_round_trips(tmp_path):
    cfg = get_cfg()
    cfg.merge_from_list(["SOLVER.BASE_LR", "0.05", "DATASETS.NAMES", "('A', 'B')"])
    path = tmp_path / "config.yaml"
    path.write_text(cfg.dump())
    again = get_cfg()
    again.merge_from_file(str(path))
    assert again == cfg


def test_inert_fastreid_keys_warn_once_naming_them(caplog):
    import logging

    from reid_engine.config import INERT_KEYS, warn_inert_keys

    cfg = get_cfg()
    logger = logging.getLogger("test_inert_keys")
    assert warn_inert_keys(cfg, logger) == []  # defaults: silent
    cfg.merge_from_list(["MODEL.BACKBONE.FEAT_DIM", "512", "SOLVER.BASE_LR", "0.1"])
    with caplog.at_level(logging.WARNING, logger="test_inert_keys"):
        assert warn_inert_keys(cfg, logger) == ["MODEL.BACKBONE.FEAT_DIM"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "test_inert_keys"]
    assert len(warnings) == 1
    assert warnings[0] == ("no effect, kept only so that fast-reid config files load: MODEL.BACKBONE.FEAT_DIM (the head "
                           "takes its input width from the backbone's out_channels)")
    assert len(INERT_KEYS) == len(set(INERT_KEYS))


def test_inert_keys_are_read_nowhere():
    """A key that code starts to read must leave INERT_KEYS (and its warning) in the same change."""
    import pathlib
    import re

    from reid_engine.config import INERT_KEYS

    package = pathlib.Path(__file__).resolve().parents[2] / "reid_engine"
    sources = "\n".join(p.read_text() for p in package.rglob("*.py") if p.parent.name != "config")
    for key in INERT_KEYS:
        parts = key.split(".")
        needle = ".".join(parts[-2:]) if parts[-1] in ("ENABLED", "MOMENTUM") else parts[-1]
        assert not re.search(r"\b" + re.escape(needle) + r"\b", sources), f"{key} is read by code"
