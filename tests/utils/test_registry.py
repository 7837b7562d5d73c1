"""The registry lookup helper: one-line message, closest match, error class, build contract."""
import pytest

from reid_engine.utils.errors import ReidUserError
from reid_engine.utils.registry import Registry, UnknownChoiceError, check_choice, closest_match, lookup


def _registry():
    registry = Registry("THING", key="THING.NAME")

    @registry.register()
    class Plain:
        def __init__(self, width, *, scale=1):
            self.width, self.scale = width, scale

    @registry.register()
    class Configured:
        def __init__(self, width):
            self.width = width

        @classmethod
        def from_config(cls, cfg, extra):
            return cls(cfg["width"] + extra)

        @staticmethod
        def check_config(cfg):
            check_choice(cfg["mode"], ("a", "b"), "MODE")

    return registry


def test_unknown_name_is_one_line_with_choices_and_suggestion():
    with pytest.raises(UnknownChoiceError) as caught:
        _registry().get("plain", key="MODEL.THING")
    assert str(caught.value) == "unknown MODEL.THING 'plain': choose one of Configured, Plain; did you mean Plain?"
    assert isinstance(caught.value, ReidUserError)
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, ValueError)


def test_no_suggestion_when_nothing_is_close_and_default_key_is_the_registry_key():
    with pytest.raises(UnknownChoiceError) as caught:
        _registry().get("zzz")
    assert str(caught.value) == "unknown THING.NAME 'zzz': choose one of Configured, Plain"
    with pytest.raises(UnknownChoiceError, match="^unknown OTHER 'zzz'"):
        Registry("OTHER").get("zzz")


@pytest.mark.parametrize("value, expected", [
    ("adam", "Adam"),                     # other case
    ("Adamm", "Adam"),                    # misspelling
    ("Naive", "NaiveIdentitySampler"),    # the only name containing it
    ("a", None),                          # contained in several: no guess
    ("qqq", None),
])
def test_closest_match(value, expected):
    assert closest_match(value, ["Adam", "SGD", "NaiveIdentitySampler", "TrainingSampler"]) == expected


def test_lookup_on_mappings_keeps_their_order_and_hint():
    table = {"18x": 1, "34x": 2, "101x": 3}
    assert lookup(table, "34x", "DEPTH") == 2
    with pytest.raises(UnknownChoiceError, match=r"^unknown DEPTH '7x': choose one of 18x, 34x, 101x; see docs$"):
        lookup(table, "7x", "DEPTH", hint="see docs")
    with pytest.raises(UnknownChoiceError, match="unknown DEPTH '50'"):
        lookup(table, 50, "DEPTH")  # a non-string value is never a name
    assert check_choice("b", ("a", "b"), "MODE") == "b"


def test_build_calls_from_config_or_the_object_and_check_config_validates():
    registry = _registry()
    assert registry.names() == ["Configured", "Plain"]
    plain = registry.build("Plain", 3, scale=2)
    assert (plain.width, plain.scale) == (3, 2)
    assert registry.build("Configured", {"width": 4}, 1).width == 5
    assert registry.check_config({"THING": {"NAME": "Configured"}, "mode": "a"}) is registry.get("Configured")
    registry.check_config({"THING": {"NAME": "Plain"}})  # no check_config: nothing to validate
    with pytest.raises(UnknownChoiceError, match="unknown MODE 'c'"):
        registry.check_config({"THING": {"NAME": "Configured"}, "mode": "c"})
    with pytest.raises(UnknownChoiceError, match="unknown THING.NAME 'Plan'.*did you mean Plain[?]"):
        registry.check_config({"THING": {"NAME": "Plan"}})
