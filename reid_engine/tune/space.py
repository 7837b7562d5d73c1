"""The search space of `reid-tune`: a YAML file of config keys to search, and what to optimize.

    objective: {metric: SyntheticReID/mAP, direction: maximize}   # <test set>/<metric> of metrics.json
    pruner: median                                                # median (default) | hyperband | none
    params:                                                       # full config keys, in this order
      SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
      SOLVER.WARMUP_ITERS: {type: int, low: 0, high: 200, step: 50}
      DATALOADER.NUM_INSTANCE: {type: categorical, choices: [2, 4, 8]}

Each param becomes an Optuna distribution (``type`` names the class: ``FloatDistribution``,
``IntDistribution``, ``CategoricalDistribution``; the other fields are its arguments), and
Optuna's own checks reject bad ranges. :func:`check_search_space` then checks the space against
the base config: the keys exist, each type fits its key, every bound and choice passes the
config's value checks, and the objective names a result the evaluation reports. Every problem is
one ``ConfigError`` line naming the file, the key and the fix. Values take their key's type (the
choice 4 of a float key is 4.0; true/false of an on/off key is "on"/"off").
"""
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
    """Load a search-space YAML file and check it on its own (no config needed).

    Raises:
        ConfigError: one line naming the file, the key or field, and the fix.
    """
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
    if kind == "categorical":
        choices = fields.get("choices")
        if not isinstance(choices, list) or len(set(map(repr, choices))) != len(choices) or \
                any(c is not None and not isinstance(c, (bool, int, float, str)) for c in choices):
            raise ConfigError(f"{where}: params.{key}.choices must be a list of distinct scalars (numbers, text, "
                              f"true/false, null), e.g. choices: [2, 4, 8]; got {choices!r}.")
        fields["choices"] = [typed_value(key, c) for c in choices]
    elif kind == "int" and fields.get("step") is None:
        fields["step"] = 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Optuna warns of a high off the step grid: an error here
            return classes[kind](**fields)
    except (TypeError, ValueError, UserWarning) as e:
        raise ConfigError(f"{where}: params.{key} (type {kind}) is not a valid range: {first_line(e)}; "
                          f"fields: {'choices' if kind == 'categorical' else 'low, high, log, step'}.") from None


def _leaf_keys(node, prefix: str = "") -> List[str]:
    keys = []
    for name, value in node.items():
        if isinstance(value, dict):
            keys.extend(_leaf_keys(value, f"{prefix}{name}."))
        else:
            keys.append(prefix + name)
    return keys


_MISSING = object()


def _lookup(cfg: CfgNode, key: str):
    """The value of a dotted key in cfg, or _MISSING."""
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _nested(key: str, value) -> Dict[str, Any]:
    """{"A": {"B": value}} for "A.B"."""
    out: Dict[str, Any] = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def evaluation_metric_names(cfg: CfgNode) -> List[str]:
    """The result names a training run's evaluation reports (as in metrics.json), for DATASETS.TESTS.

    Args:
        cfg: the config (DATASETS.TESTS, TEST.ROC.ENABLED).
    Returns:
        ``<test set>/<metric>`` for every test set and every metric ReidEvaluator reports.
    """
    metrics = list(_RANK_METRICS)
    if cfg.TEST.ROC.ENABLED:
        metrics += [roc_key(fpr) for fpr in DEFAULT_FPRS]
    return [f"{test}/{metric}" for test in cfg.DATASETS.TESTS for metric in metrics]


def check_search_space(space: SearchSpace, cfg: CfgNode) -> None:
    """Check a search space against the base config before any trial runs.

    Every key must be a scalar key of the config that no trial sets itself; the kind must fit
    the key's type (float keys: float or int ranges; int keys: int ranges; bool and text keys:
    categorical); each bound and each choice, merged alone into a copy of the config, must pass
    ``check_config_values``; the objective must name a result the run's evaluation reports.

    Args:
        space: the loaded search space.
        cfg: the base config (built from --config-file and the KEY VALUE opts).
    Raises:
        ConfigError: the first problem, as one line naming the key and the fix.
    """
    where = f"Search space {space.source or '(in memory)'}"
    leaves = _leaf_keys(cfg)
    for key, dist in space.params.items():
        _check_key(key, dist, cfg, leaves, where)
    _check_objective(space, cfg, where)
    for key, dist in space.params.items():
        for value in getattr(dist, "choices", None) or (dist.low, dist.high):
            _check_value(key, value, cfg, where)


def _check_key(key: str, dist, cfg: CfgNode, leaves: List[str], where: str) -> None:
    kind = type(dist).__name__
    if key in RESERVED_KEYS:
        raise ConfigError(f"{where}: params.{key} cannot be searched: reid-tune sets it for every trial "
                          "(its own folder and seed); remove it from params.")
    value = _lookup(cfg, key)
    if value is _MISSING:
        raise ConfigError(f"{where}: params.{key} is not a config key.{did_you_mean(key, leaves)}")
    if isinstance(value, dict):
        first = next(iter(value.keys()), "KEY")
        raise ConfigError(f"{where}: params.{key} is a config section, not a key: search one of its keys, "
                          f"e.g. {key}.{first}.")
    if isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: params.{key} holds a list ({value!r}), which cannot be searched: "
                          "search scalar keys only.")
    if kind == "CategoricalDistribution" or value is None:
        return
    if isinstance(value, bool) or isinstance(value, str):
        kind = "true/false" if isinstance(value, bool) else "text"
        raise ConfigError(f"{where}: params.{key} is a {kind} key (value {value!r}): use type: categorical "
                          "with choices.")
    if isinstance(value, int) and kind == "FloatDistribution":
        raise ConfigError(f"{where}: params.{key} is an integer key (value {value!r}): use type: int "
                          "(or categorical).")


def _check_value(key: str, value, cfg: CfgNode, where: str) -> None:
    """Merge one value alone into a copy of cfg and run the config's own checks on it."""
    trial_cfg = cfg.clone()
    trial_cfg.defrost()
    try:
        trial_cfg.merge_from_dict(_nested(key, typed_value(key, value)), source=where)
        check_config_values(trial_cfg)
    except (ReidUserError, ValueError) as e:  # ConfigError, UnknownChoiceError, a builder's ValueError
        raise ConfigError(f"{where}: params.{key} value {value!r} fails the config check: "
                          f"{' '.join(first_line(e).split())}") from None


def _check_objective(space: SearchSpace, cfg: CfgNode, where: str) -> None:
    metric = space.objective.metric
    tests = list(cfg.DATASETS.TESTS)
    if not tests:
        raise ConfigError(f"{where}: objective.metric {metric} needs an evaluation, but DATASETS.TESTS is empty: "
                          "set DATASETS.TESTS in the base config.")
    names = evaluation_metric_names(cfg)
    if metric in names:
        if space.objective.direction == "minimize":
            logger.warning("%s: objective %s is minimized, but ReID metrics are better when higher; "
                           "use direction: maximize unless that is intended", where, metric)
        return
    test, slash, result = metric.partition("/")
    if test not in tests:
        problem = f"'{test}' is not a test set of DATASETS.TESTS ({', '.join(tests)})"
        # The same result on the closest test set ("mAP" alone: on each test set).
        closest = difflib.get_close_matches(test, tests, n=1, cutoff=0.0) if slash else tests
        guesses = [g for g in (f"{t}/{result if slash else metric}" for t in closest) if g in names]
        hint = f" Did you mean: {', '.join(guesses)}?" if guesses else did_you_mean(metric, names)
    else:
        problem = "is not a result the evaluation reports"
        hint = did_you_mean(metric, names)
    raise ConfigError(f"{where}: objective.metric {metric}: {problem}; use one of {', '.join(names)}.{hint}")


# ----------------------------------------------------------------------------- trials


@functools.lru_cache(maxsize=1)
def _schema():
    return get_cfg()


def typed_value(key: str, value):
    """A searched value converted to its config key's type: an int for a float key becomes float,
    an integral float for an int key becomes int, true/false for an on/off key becomes "on"/"off".

    Args:
        key: the config key (its type is the schema's, i.e. ``get_cfg()``'s value).
        value: the value (a choice, a suggestion).
    Returns:
        the converted value; values of other types (and unknown keys) are returned as they are.
    """
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
    dists = require_optuna().distributions
    params: Dict[str, Any] = {}
    for key, dist in space.params.items():
        if isinstance(dist, dists.FloatDistribution):
            value = trial.suggest_float(key, dist.low, dist.high, log=dist.log, step=dist.step)
        elif isinstance(dist, dists.IntDistribution):
            value = trial.suggest_int(key, dist.low, dist.high, log=dist.log, step=dist.step)
        else:
            value = trial.suggest_categorical(key, list(dist.choices))
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
    """The ``KEY VALUE`` list of params, as ``cfg.merge_from_list`` and the command line take it.

    Each value is written so that the config's decoding (a Python literal where the text is one)
    gives back the same value and type: floats with ``repr`` (exact), text quoted only where it
    would otherwise read as another type (``'1'``, ``'True'``).

    Args:
        params: {config key: value}.
    Returns:
        ["KEY", "VALUE", ...] in the mapping's order.
    """
    out: List[str] = []
    for key, value in params.items():
        out += [str(key), _value_text(value)]
    return out


def _value_text(value) -> str:
    if isinstance(value, str):
        decoded = CfgNode._decode_cfg_value(value)
        return value if isinstance(decoded, str) and decoded == value else repr(value)
    if isinstance(value, (list, tuple)):
        return repr(type(value)(value))
    return repr(value)  # bool, int, float (repr is exact), None
