"""Every backbone family's check_config: a bad DEPTH, NORM or option is refused in one line,
through the builder and through the registry, before any model is built."""
import pytest

from reid_engine.modeling.backbones import (
    EffNet,
    MobileNetV2,
    MobileNetV3,
    OSNet,
    RegNet,
    RepVGG,
    ResNeSt,
    ResNeXt,
    ShuffleNetV2,
)
from reid_engine.utils.errors import ReidUserError
from reid_engine.utils.registry import UnknownChoiceError

from ._backbone_family import assert_check_config_refuses

# builder -> (backbone class, a config its check_config accepts: DEPTH, other MODEL.BACKBONE keys)
FAMILIES = {
    "build_resnest_backbone": (ResNeSt, ("269x", {})),
    "build_resnext_backbone": (ResNeXt, ("152x", {"WITH_IBN": True})),
    "build_regnet_backbone": (RegNet, ("800y", {})),
    "build_effnet_backbone": (EffNet, ("b7", {})),
    "build_repvgg_backbone": (RepVGG, ("B3g4", {})),
    "build_mobilenetv2_backbone": (MobileNetV2, ("0.5x", {})),
    "build_mobilenetv3_backbone": (MobileNetV3, ("Small", {})),
    "build_shufflenetv2_backbone": (ShuffleNetV2, ("2.0x", {})),
    "build_osnet_backbone": (OSNet, ("x0_25", {})),
}

# (builder, DEPTH, other MODEL.BACKBONE keys, error, message) of the configs refused
REFUSED = [
    ("build_resnest_backbone", "269", {}, UnknownChoiceError, "MODEL.BACKBONE.DEPTH '269'"),
    ("build_resnext_backbone", "200x", {}, UnknownChoiceError, "MODEL.BACKBONE.DEPTH '200x'"),
    ("build_regnet_backbone", "800", {}, UnknownChoiceError, "unknown MODEL.BACKBONE.DEPTH '800'.*did you mean"),
    ("build_effnet_backbone", "B0", {}, UnknownChoiceError, "unknown MODEL.BACKBONE.DEPTH 'B0'.*did you mean b0"),
    ("build_repvgg_backbone", "B4", {}, UnknownChoiceError, "unknown MODEL.BACKBONE.DEPTH 'B4'"),
    ("build_repvgg_backbone", "A0", {"NORM": "bn"}, UnknownChoiceError,
     "unknown MODEL.BACKBONE.NORM 'bn'.*did you mean BN"),
    ("build_mobilenetv2_backbone", "2.0x", {}, UnknownChoiceError, "MODEL.BACKBONE.DEPTH"),
    ("build_mobilenetv2_backbone", "0.5x", {"NORM": "bn"}, UnknownChoiceError, "MODEL.BACKBONE.NORM"),
    ("build_mobilenetv3_backbone", "2.0x", {}, UnknownChoiceError, "MODEL.BACKBONE.DEPTH"),
    ("build_mobilenetv3_backbone", "Small", {"NORM": "bn"}, UnknownChoiceError, "MODEL.BACKBONE.NORM"),
    ("build_shufflenetv2_backbone", "3.0x", {}, UnknownChoiceError, "MODEL.BACKBONE.DEPTH '3.0x'"),
    # ConfigError, or UnknownChoiceError for a wrong name
    ("build_osnet_backbone", "x2_0", {}, ReidUserError, None),
    ("build_osnet_backbone", "x0_25", {"WITH_NL": True}, ReidUserError, None),
    ("build_osnet_backbone", "ain_x1_0", {"WITH_IBN": True}, ReidUserError, None),
]


def _case_id(case):
    name, depth, opts = case[:3]
    family = name[len("build_"):-len("_backbone")]
    return "-".join([family, depth] + [f"{key}={value}" for key, value in opts.items()])


@pytest.mark.parametrize("name, depth, opts, error, message", REFUSED, ids=[_case_id(case) for case in REFUSED])
def test_check_config_refuses_without_building(name, depth, opts, error, message, monkeypatch):
    model_cls, accepted = FAMILIES[name]
    assert_check_config_refuses(monkeypatch, name, model_cls, (depth, opts, error, message), accepted)
