"""The search space of `reid-tune` (docs/tuning.md shows the file): each params entry becomes an Optuna
distribution, whose own checks reject bad ranges; :func:`check_search_space` then merges every bound and
choice into the base config and checks it as reid-train does. Values take their key's type."""
import difflib
import functools
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping

import yaml

from ..config import CfgNode, ConfigError, get_cfg
from ..config.config import did_you_mean
from ..config.on_off_keys import ON_OFF_KEYS
from ..engine.config_checks import check_config_values
from ..evaluation.roc import DEFAULT_FPRS, roc_key
from ..utils.errors import ReidUserError, first_line
from .study import PRUNERS, require_optuna

__all__ = ["DIRECTIONS", "Objective", "SearchSpace", "load_search_space", "check_search_space",
           "evaluation_metric_names", "suggest_overrides", "base_params", "overrides_list", "typed_value"]

logger = logging.getLogger(__name__)

DIRECTIONS = ("maximize", "minimize")
RESERVED_KEYS = ("OUTPUT_DIR", "SEED")  # every trial sets them itself (its folder, its seed)
_SECTIONS = ("objective", "pruner", "params")
_RANK_METRICS = ("Rank-1", "Rank-5", "Rank-10", "mAP", "mINP", "metric")  # ReidEvaluator's, in its order
_EXAMPLE = "SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}"


@dataclass(frozen=True)
class Objective:
    """The evaluation result to optimize (``<test set>/<metric>``) and its direction."""

    metric: str
    direction: str


@dataclass(frozen=True)
class SearchSpace:
    """A loaded search space: config key -> Optuna distribution (file order), objective, pruner, file."""

    params: Dict[str, Any]
    objective: Objective
    pruner: str = "median"
    source: str = ""

    @property
    def keys(self) -> List[str]:
        """The searched config keys, in file order."""
        return list(self.params)


def load_search_space(path: str) -> SearchSpace:
    """Load a search-space YAML file and check it on its own (ConfigError: one line naming the file, key, fix)."""
    source = os.path.abspath(os.path.expanduser(path))
    where = f"Search space {source}"
    if not os.path.isfile(source):
        raise ConfigError(f"Search space file not found: {source} (check the --search-space path).")
    try:
        with open(source, "r", encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {first_line(e)}.") from None
    if not isinstance(data, dict) or "objective" not in data or "params" not in data:
        raise ConfigError(f"{where} must be a mapping with the sections objective ({{metric: SyntheticReID/mAP, "
                          f"direction: maximize}}) and params ({{{_EXAMPLE}}}), and optionally pruner.")
    for section in data:
        if section not in _SECTIONS:
            raise ConfigError(f"{where}: unknown section '{section}': use {', '.join(_SECTIONS)}."
                              f"{did_you_mean(str(section), list(_SECTIONS))}")
    objective = data["objective"]
    if not isinstance(objective, dict) or set(objective) != {"metric", "direction"} \
            or not isinstance(objective["metric"], str) or objective["direction"] not in DIRECTIONS:
        raise ConfigError(f"{where}: objective must be {{metric: <test set>/<result>, direction: maximize or "
                          f"minimize}}, got {objective!r}.")
    pruner = data.get("pruner", "median")
    pruner = "none" if pruner in (None, False) else pruner  # YAML reads null / off as such
    if pruner not in PRUNERS:
        raise ConfigError(f"{where}: pruner '{pruner}' is unknown: use {', '.join(PRUNERS)}."
                          f"{did_you_mean(str(pruner), list(PRUNERS))}")
    if not isinstance(data["params"], dict) or not data["params"]:
        raise ConfigError(f"{where}: 'params' must be a non-empty mapping of config keys, e.g. {_EXAMPLE}.")
    params = {str(key): _distribution(str(key), spec, where) for key, spec in data["params"].items()}
    return SearchSpace(params, Objective(objective["metric"].strip(), objective["direction"]), pruner, source)


def _number(value):
    """YAML reads 1e-4 (no dot) as text: such text is read as a number."""
    try:
        return float(value) if isinstance(value, str) else value
    except ValueError:
        return value


def _distribution(key: str, spec, where: str):
    """The Optuna distribution of one params entry; Optuna's checks are the range checks."""
    dists = require_optuna().distributions
    classes = {"float": dists.FloatDistribution, "int": dists.IntDistribution,
               "categorical": dists.CategoricalDistribution}
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind not in classes:
        raise ConfigError(f"{where}: params.{key} needs type: float, int or categorical, got {spec!r}, e.g. "
                          f"{_EXAMPLE}.{did_you_mean(str(kind), list(classes)) if kind else ''}")
    fields = {name: _number(value) if name in ("low", "high", "step") else value
              for name, value in spec.items() if name != "type"}
    choices = fields.get("choices")
    if kind == "categorical" and (not isinstance(choices, list) or len(set(map(repr, choices))) != len(choices)
                                  or not all(isinstance(c, (bool, int, float, str, type(None))) for c in choices)):
        raise ConfigError(f"{where}: params.{key}.choices must be a list of distinct scalars (numbers, text, "
                          f"true/false, null), e.g. choices: [2, 4, 8]; got {choices!r}.")
    if kind == "categorical":
        fields["choices"] = [typed_value(key, c) for c in choices]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Optuna warns of a high off the step grid: an error here
            return classes[kind](**fields)
    except (TypeError, ValueError, UserWarning) as e:
        raise ConfigError(f"{where}: params.{key} (type {kind}) is not a valid range: {first_line(e)}; "
                          f"fields: {'choices' if kind == 'categorical' else 'low, high, log, step'}.") from None


_MISSING = object()


def _lookup(cfg: CfgNode, key: str):
    """The value of a dotted key in cfg, or _MISSING."""
    for part in key.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return _MISSING
        cfg = cfg[part]
    return cfg


def evaluation_metric_names(cfg: CfgNode) -> List[str]:
    """The result names the evaluation reports (as in metrics.json): ``<test set>/<metric>``."""
    metrics = list(_RANK_METRICS) + ([roc_key(fpr) for fpr in DEFAULT_FPRS] if cfg.TEST.ROC.ENABLED else [])
    return [f"{test}/{metric}" for test in cfg.DATASETS.TESTS for metric in metrics]


def check_search_space(space: SearchSpace, cfg: CfgNode) -> None:
    """Check a search space against the base config before any trial runs (ConfigError: one line)."""
    where = f"Search space {space.source or '(in memory)'}: "
    for key, dist in space.params.items():  # no trial sets the key itself, a number range fits its type
        value, numeric = _lookup(cfg, key), {"FloatDistribution": (float,), "IntDistribution": (int, float)}
        kind = {bool: "a true/false", str: "a text", int: "an integer"}.get(type(value))
        if key in RESERVED_KEYS:
            raise ConfigError(f"{where}params.{key} cannot be searched: reid-tune sets it for every trial; remove "
                              "it from params.")
        if kind and type(value) not in numeric.get(type(dist).__name__, (type(value),)):
            raise ConfigError(f"{where}params.{key} is {kind} key (value {value!r}): use type: "
                              + ("int." if kind == "an integer" else "categorical with choices."))
    metric, names = space.objective.metric, evaluation_metric_names(cfg)
    if not cfg.DATASETS.TESTS:
        raise ConfigError(f"{where}objective.metric {metric} needs an evaluation, but DATASETS.TESTS is empty: "
                          "set DATASETS.TESTS in the base config.")
    if metric not in names:
        results = {n.rsplit("/", 1)[-1].lower(): n.rsplit("/", 1)[-1] for n in names}
        close = difflib.get_close_matches(metric.rsplit("/", 1)[-1].lower(), list(results), 1, 0.6)
        hint = f" Did you mean: {cfg.DATASETS.TESTS[0]}/{results[close[0]]}?" if close else ""
        raise ConfigError(f"{where}objective.metric {metric} is not a result the evaluation reports (test sets: "
                          f"{', '.join(cfg.DATASETS.TESTS)}): use one of {', '.join(names)}.{hint}")
    if space.objective.direction == "minimize":
        logger.warning("%sobjective %s is minimized, but ReID metrics are better when higher", where, metric)
    for key, dist in space.params.items():
        for value in getattr(dist, "choices", None) or (dist.low, dist.high):
            trial_cfg = cfg.clone()
            trial_cfg.defrost()
            try:  # each bound and choice alone, merged and checked as reid-train checks a config
                trial_cfg.merge_from_list([key, _value_text(typed_value(key, value))])
                check_config_values(trial_cfg)
            except (ReidUserError, ValueError) as e:  # ConfigError, UnknownChoiceError, a builder's ValueError
                raise ConfigError(f"{where}params.{key} value {value!r} fails the config check: "
                                  f"{' '.join(first_line(e).split())}") from None


@functools.lru_cache(maxsize=1)
def _schema():
    return get_cfg()


def typed_value(key: str, value):
    """`value` in its config key's type (the schema's): an int of a float key becomes float, an integral
    float of an int key int, true/false of an on/off key "on"/"off"; anything else as it is."""
    default = _lookup(_schema(), key)
    if isinstance(value, bool):
        if isinstance(default, str) and key in ON_OFF_KEYS:
            return "on" if value else "off"
        return value
    if isinstance(default, bool) or default is _MISSING:
        return value
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    if isinstance(default, int) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def suggest_overrides(trial, space: SearchSpace) -> Dict[str, Any]:
    """Ask the trial for every param's value, in file order: {config key: value typed like its key}."""
    ints, params = require_optuna().distributions.IntDistribution, {}
    for key, dist in space.params.items():
        value = trial.suggest_categorical(key, list(dist.choices)) if hasattr(dist, "choices") else (
            trial.suggest_int if isinstance(dist, ints) else trial.suggest_float)(key, dist.low, dist.high,
                                                                                  log=dist.log, step=dist.step)
        params[key] = typed_value(key, value)
    return params


def base_params(space: SearchSpace, cfg: CfgNode) -> Dict[str, Any]:
    """The base config's value of each searched key, to enqueue the base config as the first trial.
    A value its distribution cannot take is left out with one INFO line (the first trial samples it)."""
    params: Dict[str, Any] = {}
    for key, dist in space.params.items():
        value = typed_value(key, _lookup(cfg, key))
        if hasattr(dist, "choices"):
            inside = any(type(c) is type(value) and c == value for c in dist.choices)
        else:
            grid = (value - dist.low) / dist.step if dist.step else 0.0
            inside = isinstance(value, (int, float)) and not isinstance(value, bool) and \
                dist.low <= value <= dist.high and abs(grid - round(grid)) < 1e-9
        if inside:
            params[key] = value
        else:
            logger.info("Search space: the base config's %s = %r is outside %s; the first trial samples it",
                        key, value, dist)
    return params


def overrides_list(params: Mapping[str, Any]) -> List[str]:
    """``["KEY", "VALUE", ...]`` for ``merge_from_list`` and the command line; each value decodes back to
    the same value and type (floats by ``repr``, text quoted only where it would read as another type)."""
    return [text for key, value in params.items() for text in (str(key), _value_text(value))]


def _value_text(value) -> str:
    if isinstance(value, str):
        decoded = CfgNode._decode_cfg_value(value)
        return value if isinstance(decoded, str) and decoded == value else repr(value)
    if isinstance(value, (list, tuple)):
        return repr(type(value)(value))
    return repr(value)  # bool, int, float (repr is exact), None
