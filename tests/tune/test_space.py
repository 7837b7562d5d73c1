"""The search-space file: loading, checking against a config, suggesting and enqueueing values."""
import logging
import os

import pytest
import torch

from reid_engine.config import ConfigError, get_cfg
from reid_engine.evaluation import ReidEvaluator
from reid_engine.tune.space import (
    base_params,
    check_search_space,
    evaluation_metric_names,
    load_search_space,
    overrides_list,
    suggest_overrides,
    typed_value,
)
from tests.conftest import REPO_ROOT

optuna = pytest.importorskip("optuna")

DEMO_SPACE = os.path.join(REPO_ROOT, "configs", "tune", "synthetic_demo.yml")
QUICK_CONFIG = os.path.join(REPO_ROOT, "configs", "SyntheticReID", "bagtricks_R18_quick.yml")

HEAD = "objective: {metric: SyntheticReID/mAP, direction: maximize}\n"


def _write(tmp_path, text: str, name: str = "space.yml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _space(tmp_path, params: str, head: str = HEAD):
    return load_search_space(_write(tmp_path, head + "params:\n" + params))


@pytest.fixture(scope="module")
def quick_cfg(tmp_path_factory):
    """The demo's base config, with OUTPUT_DIR in a temp folder (the checks look at it)."""
    cfg = get_cfg()
    cfg.merge_from_file(QUICK_CONFIG)
    cfg.OUTPUT_DIR = str(tmp_path_factory.mktemp("out"))
    cfg.freeze()
    return cfg


def _one_line_error(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ----------------------------------------------------------------------------- the demo file


def test_demo_space_loads_in_file_order_and_fits_its_config(quick_cfg):
    space = load_search_space(DEMO_SPACE)
    assert space.keys == ["SOLVER.BASE_LR", "MODEL.LOSSES.TRI.MARGIN", "MODEL.LOSSES.CE.EPSILON",
                          "DATALOADER.NUM_INSTANCE", "INPUT.REA.PROB"]
    assert space.objective.metric == "SyntheticReID/mAP" and space.objective.direction == "maximize"
    assert space.pruner == "median" and space.source == DEMO_SPACE
    dists = optuna.distributions
    assert space.params["SOLVER.BASE_LR"] == dists.FloatDistribution(3e-4, 3e-3, log=True)
    assert space.params["DATALOADER.NUM_INSTANCE"] == dists.CategoricalDistribution([2, 4, 8])
    check_search_space(space, quick_cfg)  # raises on any problem
    # Every range holds the base value: the first trial is the base config as it is.
    assert base_params(space, quick_cfg) == {
        "SOLVER.BASE_LR": 0.001, "MODEL.LOSSES.TRI.MARGIN": 0.3, "MODEL.LOSSES.CE.EPSILON": 0.1,
        "DATALOADER.NUM_INSTANCE": 4, "INPUT.REA.PROB": 0.5}


def test_ranges_steps_and_defaults(tmp_path):
    space = _space(tmp_path, "  SOLVER.WARMUP_ITERS: {type: int, low: 0, high: 200, step: 50}\n"
                             "  SOLVER.BASE_LR: {type: float, low: 1e-4, high: 3.0e-3, log: true}\n"
                             "  MODEL.LOSSES.TRI.MARGIN: {type: float, low: 0.1, high: 0.5, step: 0.1}\n"
                             "  SOLVER.MAX_EPOCH: {type: int, low: 2, high: 64, log: true}\n")
    warm, lr, margin, epochs = space.params.values()
    assert (warm.low, warm.high, warm.step) == (0, 200, 50) and isinstance(warm.low, int)
    assert lr.low == 1e-4 and isinstance(lr.low, float)  # YAML text "1e-4" read as the number
    assert margin.step == 0.1  # 0.4 / 0.1 is 3.9999999999999996: a multiple within rounding
    assert epochs.step == 1 and epochs.log
    assert space.pruner == "median"


def test_pruner_section(tmp_path):
    assert load_search_space(_write(tmp_path, HEAD + "pruner: none\nparams:\n"
                                    "  SOLVER.BASE_LR: {type: float, low: 0.1, high: 0.2}\n")).pruner == "none"
    assert load_search_space(_write(tmp_path, HEAD + "pruner: hyperband\nparams:\n"
                                    "  SOLVER.BASE_LR: {type: float, low: 0.1, high: 0.2}\n")).pruner == "hyperband"


# ----------------------------------------------------------------------------- load errors

P = "params:\n  SOLVER.BASE_LR: "


@pytest.mark.parametrize("text, expected", [
    ("- just\n- a list\n", ["must be a mapping with the sections objective", "and params"]),
    ("objectve: {metric: SyntheticReID/mAP, direction: maximize}\n" + P + "{type: float, low: 0.1, high: 0.2}\n",
     ["must be a mapping with the sections objective"]),
    (HEAD + "pruners: median\n" + P + "{type: float, low: 0.1, high: 0.2}\n",
     ["unknown section 'pruners'", "Did you mean: pruner?"]),
    ("objective: {metric: SyntheticReID/mAP, direction: maximise}\n" + P + "{type: float, low: 0.1, high: 0.2}\n",
     ["objective must be {metric: <test set>/<result>, direction: maximize or minimize}", "maximise"]),
    (HEAD + "pruner: medain\n" + P + "{type: float, low: 0.1, high: 0.2}\n",
     ["pruner 'medain' is unknown", "median, hyperband, none", "Did you mean: median?"]),
    (HEAD + "params: {}\n", ["'params' must be a non-empty mapping of config keys"]),
    (HEAD + P + "0.001\n", ["params.SOLVER.BASE_LR needs type: float, int or categorical"]),
    (HEAD + P + "{type: flaot, low: 0.1, high: 0.2}\n", ["params.SOLVER.BASE_LR needs type", "Did you mean: float?"]),
    (HEAD + P + "{type: float, lo: 0.1, high: 0.2}\n",
     ["params.SOLVER.BASE_LR (type float) is not a valid range", "'lo'", "fields: low, high, log, step"]),
    (HEAD + P + "{type: float, low: 0.2, high: 0.1}\n", ["params.SOLVER.BASE_LR (type float)", "`low <= high`"]),
    (HEAD + P + "{type: float, low: 0.0, high: 0.1, log: true}\n", ["`low > 0` must hold for `log=True`"]),
    (HEAD + P + "{type: float, low: 0.1, high: 0.5, step: 0.1, log: true}\n", ["`step` is not supported when `log`"]),
    (HEAD + "params:\n  SOLVER.WARMUP_ITERS: {type: int, low: 0, high: 200, step: 30}\n",
     ["params.SOLVER.WARMUP_ITERS (type int) is not a valid range", "not divisible by `step`"]),
    (HEAD + "params:\n  DATALOADER.NUM_INSTANCE: {type: categorical, choices: []}\n",
     ["params.DATALOADER.NUM_INSTANCE (type categorical) is not a valid range", "one or more elements"]),
    (HEAD + "params:\n  INPUT.SIZE_TRAIN: {type: categorical, choices: [[256, 128], [128, 64]]}\n",
     ["params.INPUT.SIZE_TRAIN.choices must be a list of distinct scalars"]),
    (HEAD + "params:\n  DATALOADER.NUM_INSTANCE: {type: categorical, choices: [2, 4, 2]}\n",
     ["params.DATALOADER.NUM_INSTANCE.choices must be a list of distinct scalars", "got [2, 4, 2]"]),
])
def test_load_errors_are_one_line_naming_file_key_and_fix(tmp_path, text, expected):
    path = _write(tmp_path, text)
    message = _one_line_error(load_search_space, path)
    assert path in message
    for part in expected:
        assert part in message, (part, message)


def test_missing_file_and_bad_yaml(tmp_path):
    missing = str(tmp_path / "nope.yml")
    message = _one_line_error(load_search_space, missing)
    assert message == f"Search space file not found: {missing} (check the --search-space path)."
    bad = _write(tmp_path, "objective: [unclosed\n")
    message = _one_line_error(load_search_space, bad)
    assert message.startswith(f"Search space {bad} is not valid YAML: ")


# ----------------------------------------------------------------------------- check errors


@pytest.mark.parametrize("params, expected", [
    ("  SOLVER.BASE_LRR: {type: float, low: 0.1, high: 0.2}\n",
     ["params.SOLVER.BASE_LRR value 0.1 fails the config check:", "Did you mean: SOLVER.BASE_LR"]),
    ("  SOLVER: {type: float, low: 0.1, high: 0.2}\n",
     ["params.SOLVER value 0.1 fails the config check:", "is a section; override one of its keys"]),
    ("  SOLVER.STEPS: {type: int, low: 1, high: 20}\n",
     ["params.SOLVER.STEPS value 1 fails the config check:", "expects"]),
    ("  SEED: {type: int, low: 0, high: 5}\n",
     ["params.SEED cannot be searched: reid-tune sets it for every trial", "remove it from params"]),
    ("  OUTPUT_DIR: {type: categorical, choices: [a, b]}\n", ["params.OUTPUT_DIR cannot be searched"]),
    ("  INPUT.REA.ENABLED: {type: float, low: 0, high: 1}\n",
     ["params.INPUT.REA.ENABLED is a true/false key (value True)", "use type: categorical with choices"]),
    ("  SOLVER.OPT: {type: int, low: 0, high: 1}\n",
     ["params.SOLVER.OPT is a text key (value 'Adam')", "use type: categorical"]),
    ("  DATALOADER.NUM_INSTANCE: {type: float, low: 2, high: 8}\n",
     ["params.DATALOADER.NUM_INSTANCE is an integer key (value 4)", "use type: int"]),
    ("  SOLVER.OPT: {type: categorical, choices: [Adam, Adamm]}\n",
     ["params.SOLVER.OPT value 'Adamm' fails the config check:", "SOLVER.OPT", "Adam"]),
    ("  SOLVER.BASE_LR: {type: categorical, choices: [0.001, fast]}\n",
     ["params.SOLVER.BASE_LR value 'fast' fails the config check:",
      "Config key SOLVER.BASE_LR expects float"]),
    ("  DATALOADER.NUM_INSTANCE: {type: categorical, choices: [4, 2.5]}\n",
     ["params.DATALOADER.NUM_INSTANCE value 2.5 fails the config check:", "expects int"]),
])
def test_check_errors_are_one_line_naming_key_and_fix(tmp_path, quick_cfg, params, expected):
    space = _space(tmp_path, params)
    message = _one_line_error(check_search_space, space, quick_cfg)
    assert space.source in message
    for part in expected:
        assert part in message, (part, message)


def test_a_bound_that_fails_the_config_checks(tmp_path, quick_cfg):
    """Each bound is merged into the base config and checked like reid-train checks a config."""
    space = _space(tmp_path, "  PSEUDO.EPS: {type: float, low: 0.4, high: 1.5}\n")
    message = _one_line_error(check_search_space, space, quick_cfg)
    assert "params.PSEUDO.EPS value 1.5 fails the config check: PSEUDO.EPS" in message
    assert "below 1.0" in message


@pytest.mark.parametrize("metric, expected", [
    ("Market1501/mAP", ["objective.metric Market1501/mAP is not a result the evaluation reports (test sets: "
                        "SyntheticReID)", "use one of SyntheticReID/Rank-1, ", "Did you mean: SyntheticReID/mAP?"]),
    ("SyntheticReID/map", ["objective.metric SyntheticReID/map is not a result", "SyntheticReID/mINP",
                           "Did you mean: SyntheticReID/mAP?"]),
    ("mAP", ["objective.metric mAP is not a result", "Did you mean: SyntheticReID/mAP?"]),
])
def test_objective_errors(tmp_path, quick_cfg, metric, expected):
    head = f"objective: {{metric: {metric}, direction: maximize}}\n"
    space = _space(tmp_path, "  SOLVER.BASE_LR: {type: float, low: 0.0001, high: 0.01}\n", head=head)
    message = _one_line_error(check_search_space, space, quick_cfg)
    for part in expected:
        assert part in message, (part, message)


def test_objective_needs_a_test_set(tmp_path, quick_cfg):
    cfg = quick_cfg.clone()
    cfg.defrost()
    cfg.DATASETS.TESTS = ()
    space = _space(tmp_path, "  SOLVER.BASE_LR: {type: float, low: 0.0001, high: 0.01}\n")
    message = _one_line_error(check_search_space, space, cfg)
    assert "DATASETS.TESTS is empty: set DATASETS.TESTS in the base config" in message


def test_roc_metrics_and_minimize_warning(tmp_path, quick_cfg, caplog):
    cfg = quick_cfg.clone()
    cfg.defrost()
    cfg.TEST.ROC.ENABLED = True
    head = "objective: {metric: SyntheticReID/TPR@FPR=1e-04, direction: minimize}\n"
    space = _space(tmp_path, "  SOLVER.BASE_LR: {type: float, low: 0.0001, high: 0.01}\n", head=head)
    with caplog.at_level(logging.WARNING, logger="reid_engine.tune.space"):
        check_search_space(space, cfg)
    assert "SyntheticReID/TPR@FPR=1e-04 is minimized" in caplog.text
    _one_line_error(check_search_space, space, quick_cfg)  # no ROC results without TEST.ROC.ENABLED


@pytest.mark.parametrize("roc", [False, True])
def test_metric_names_are_what_the_evaluator_reports(roc):
    """The objective check lists ReidEvaluator's own result names (guards against drift)."""
    cfg = get_cfg()
    cfg.DATASETS.TESTS = ("A", "B")
    cfg.TEST.ROC.ENABLED = roc
    evaluator = ReidEvaluator(cfg, num_query=4)
    gen = torch.Generator().manual_seed(0)
    pids = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    evaluator.process({"targets": pids, "camids": torch.tensor([0] * 4 + [1] * 6)}, torch.randn(10, 8, generator=gen))
    reported = list(evaluator.evaluate())
    assert evaluation_metric_names(cfg) == [f"{t}/{m}" for t in ("A", "B") for m in reported]


# ----------------------------------------------------------------------------- trials


def _in_memory_study(direction="maximize"):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction=direction,
                               sampler=optuna.samplers.RandomSampler(seed=0))


def test_suggest_overrides_types_and_ranges(tmp_path):
    space = _space(tmp_path, "  SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}\n"
                             "  SOLVER.WARMUP_ITERS: {type: int, low: 0, high: 200, step: 50}\n"
                             "  MODEL.LOSSES.TRI.MARGIN: {type: categorical, choices: [0, 1]}\n"
                             "  SOLVER.OPT: {type: categorical, choices: [Adam, SGD]}\n"
                             "  INPUT.REA.ENABLED: {type: categorical, choices: [true, false]}\n"
                             "  MODEL.COMPILE: {type: categorical, choices: [true, false]}\n")
    study = _in_memory_study()
    for _ in range(5):
        trial = study.ask()
        params = suggest_overrides(trial, space)
        assert list(params) == space.keys
        assert 1e-4 <= params["SOLVER.BASE_LR"] <= 3e-3 and isinstance(params["SOLVER.BASE_LR"], float)
        assert params["SOLVER.WARMUP_ITERS"] in (0, 50, 100, 150, 200)
        assert type(params["SOLVER.WARMUP_ITERS"]) is int
        assert params["MODEL.LOSSES.TRI.MARGIN"] in (0.0, 1.0)
        assert type(params["MODEL.LOSSES.TRI.MARGIN"]) is float  # an int choice of a float key
        assert params["SOLVER.OPT"] in ("Adam", "SGD")
        assert type(params["INPUT.REA.ENABLED"]) is bool
        assert params["MODEL.COMPILE"] in ("on", "off")  # an on/off text key's true/false
        # The Optuna param name is the config key, with the distribution the spec describes.
        assert trial.distributions == space.params
        study.tell(trial, 1.0)


def test_base_params_enqueue_the_base_config_as_is(tmp_path, quick_cfg, caplog):
    space = _space(tmp_path, "  SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}\n"
                             "  SOLVER.WARMUP_ITERS: {type: int, low: 0, high: 300, step: 100}\n"
                             "  DATALOADER.NUM_INSTANCE: {type: categorical, choices: [2, 8]}\n"
                             "  SOLVER.OPT: {type: categorical, choices: [SGD, Adam]}\n"
                             "  MODEL.LOSSES.TRI.MARGIN: {type: float, low: 0.5, high: 0.9}\n")
    with caplog.at_level(logging.INFO, logger="reid_engine.tune.space"):
        base = base_params(space, quick_cfg)
    # WARMUP_ITERS 150 is off the step grid, NUM_INSTANCE 4 not a choice, MARGIN 0.3 out of range.
    assert base == {"SOLVER.BASE_LR": 0.001, "SOLVER.OPT": "Adam"}
    assert "SOLVER.WARMUP_ITERS = 150 is outside IntDistribution(high=300, log=False, low=0, step=100); the first " \
        "trial samples it" in caplog.text
    assert "DATALOADER.NUM_INSTANCE = 4 is outside CategoricalDistribution(choices=(2, 8))" in caplog.text
    assert "MODEL.LOSSES.TRI.MARGIN = 0.3 is outside FloatDistribution(high=0.9" in caplog.text

    study = _in_memory_study()
    study.enqueue_trial(base)
    params = suggest_overrides(study.ask(), space)
    assert params["SOLVER.BASE_LR"] == 0.001 and params["SOLVER.OPT"] == "Adam"
    assert params["SOLVER.WARMUP_ITERS"] in (0, 100, 200, 300)


def test_base_params_match_float_and_int_choices(quick_cfg, tmp_path):
    space = _space(tmp_path, "  MODEL.LOSSES.CE.EPSILON: {type: categorical, choices: [0, 0.1]}\n"
                             "  DATALOADER.NUM_INSTANCE: {type: categorical, choices: [2, 4]}\n")
    base = base_params(space, quick_cfg)
    assert base == {"MODEL.LOSSES.CE.EPSILON": 0.1, "DATALOADER.NUM_INSTANCE": 4}
    study = _in_memory_study()
    study.enqueue_trial(base)
    assert suggest_overrides(study.ask(), space) == base


def test_typed_value():
    assert typed_value("SOLVER.BASE_LR", 1) == 1.0 and type(typed_value("SOLVER.BASE_LR", 1)) is float
    assert type(typed_value("DATALOADER.NUM_INSTANCE", 4.0)) is int
    assert typed_value("DATALOADER.NUM_INSTANCE", 4.5) == 4.5  # left for the check to report
    assert typed_value("INPUT.REA.ENABLED", True) is True
    assert typed_value("NOT.A.KEY", 3) == 3


@pytest.mark.parametrize("key, value", [
    ("SOLVER.BASE_LR", 0.00035),
    ("SOLVER.BASE_LR", 1 / 3),
    ("SOLVER.BASE_LR", 1e-7),
    ("SOLVER.WEIGHT_DECAY", 0.0),
    ("DATALOADER.NUM_INSTANCE", 8),
    ("INPUT.REA.ENABLED", False),
    ("INPUT.REA.ENABLED", True),
    ("SOLVER.OPT", "SGD"),
    ("MODEL.WEIGHTS", "1"),                # text that reads as a number
    ("MODEL.WEIGHTS", "True"),             # ... as a boolean
    ("MODEL.WEIGHTS", "None"),
    ("MODEL.WEIGHTS", "[1, 2]"),
    ("MODEL.WEIGHTS", "runs/a b/model.pth"),
    ("MODEL.WEIGHTS", ""),
    ("MODEL.COMPILE", "off"),
])
def test_overrides_list_round_trips_through_merge_from_list(key, value):
    text = overrides_list({key: value})
    assert text[0] == key and isinstance(text[1], str)
    cfg = get_cfg()
    cfg.merge_from_list(text)
    node = cfg
    for part in key.split("."):
        node = node[part]
    assert node == value and type(node) is type(value), (text, node)


def test_overrides_list_keeps_order():
    assert overrides_list({"SOLVER.BASE_LR": 0.001, "SOLVER.OPT": "SGD", "DATALOADER.NUM_INSTANCE": 4}) == [
        "SOLVER.BASE_LR", "0.001", "SOLVER.OPT", "SGD", "DATALOADER.NUM_INSTANCE", "4"]
