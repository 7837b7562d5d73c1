"""On/off keys (auto / on / off) take the booleans a user naturally writes: YAML true / false (and YAML 1.1's
bare on / off, which it reads as booleans) and False / True on the command line; the set of such keys is
complete, so no on/off key refuses a boolean with a type error."""
import pytest

from reid_engine.config import ConfigError, get_cfg
from reid_engine.config.on_off_keys import ON_OFF_CHOICES, ON_OFF_KEYS
from reid_engine.data.build import check_data_config

#: string keys whose default is one of the on/off words but whose values are other words
OTHER_WORDS = {"MODEL.DEVICE": "cpu / cuda", "MODEL.COMPILE_SCOPE": "model / blocks", "SOLVER.AMP.DTYPE": "bf16 / fp16"}


def _get(cfg, key):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def _string_keys(node, prefix=""):
    for name, value in node.items():
        key = f"{prefix}{name}"
        if hasattr(value, "items"):
            yield from _string_keys(value, key + ".")
        elif isinstance(value, str):
            yield key, value


def test_every_on_off_key_is_known():
    candidates = {key for key, value in _string_keys(get_cfg()) if value in ON_OFF_CHOICES}
    assert candidates - set(OTHER_WORDS) == ON_OFF_KEYS


@pytest.mark.parametrize("key", sorted(ON_OFF_KEYS))
def test_booleans_from_yaml_and_the_command_line(key, tmp_path):
    section, _, leaf = key.rpartition(".")
    path = tmp_path / "cfg.yaml"
    for written, expected in (("false", "off"), ("true", "on"), ("off", "off"), ("on", "on"), ("auto", "auto")):
        # YAML nests the sections: MODEL:\n  COMPILE: false
        lines = [f"{'  ' * depth}{part}:" for depth, part in enumerate(section.split("."))]
        path.write_text("\n".join(lines) + f"\n{'  ' * len(section.split('.'))}{leaf}: {written}\n")
        cfg = get_cfg()
        cfg.merge_from_file(str(path))
        assert _get(cfg, key) == expected, written
    for written, expected in ((False, "off"), (True, "on"), ("False", "off"), ("True", "on"), ("off", "off")):
        cfg = get_cfg()
        cfg.merge_from_list([key, written])
        assert _get(cfg, key) == expected, written


def test_cache_images_false_is_off_and_a_bool_elsewhere_still_a_type_error(tmp_path):
    cfg = get_cfg()
    cfg.merge_from_list(["DATALOADER.CACHE_IMAGES", "False", "DATASETS.NAMES", ("SyntheticReIDTiny",)])
    assert cfg.DATALOADER.CACHE_IMAGES == "off"
    check_data_config(cfg)
    with pytest.raises(ConfigError, match="MODEL.DEVICE expects str"):
        get_cfg().merge_from_list(["MODEL.DEVICE", "False"])
