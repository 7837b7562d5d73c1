"""The search space of `reid-tune`: a YAML file of config keys to search, and what to optimize.

The file::

    objective:
      metric: SyntheticReID/mAP     # an evaluation result as named in metrics.json: <test set>/<metric>
      direction: maximize           # or minimize
    pruner: median                  # median (the default) | hyperband | none
    params:                         # full config keys, searched in this order
      SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
      SOLVER.WARMUP_ITERS: {type: int, low: 0, high: 200, step: 50}
      DATALOADER.NUM_INSTANCE: {type: categorical, choices: [2, 4, 8]}

- ``float``: ``low`` < ``high``; optional ``log`` (needs ``low`` > 0) or ``step`` (not both;
  ``high - low`` a multiple of it).
- ``int``: integer bounds; optional ``step`` (>= 1) or ``log`` (needs ``low`` >= 1).
- ``categorical``: ``choices``, a non-empty list of scalars (null, true/false, numbers, text).

The Optuna parameter name of each key is the key itself, and values take their key's type
(the choice 4 of a float key is 4.0; true/false of an on/off key is "on"/"off"), so what a
trial records is what its config holds. Loading checks the file alone
(:func:`load_search_space`); :func:`check_search_space` checks it against the base config
before any trial runs: the keys exist, each kind fits its key's type, every bound and choice
passes the config's own value checks, and the objective names a result the evaluation
reports. Every problem is one ``ConfigError`` line naming the file, the key and the fix.
"""
import ast
import difflib
import functools
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Tuple

import yaml

from ..config import CfgNode, ConfigError, get_cfg
from ..config.config import did_you_mean
from ..config.on_off_keys import ON_OFF_KEYS
from ..engine.config_checks import check_config_values
from ..evaluation.roc import DEFAULT_FPRS, roc_key
from ..utils.errors import ReidUserError
from .study import PRUNERS, require_optuna

__all__ = [
    "KINDS",
    "PRUNERS",
    "DIRECTIONS",
    "ParamSpec",
    "Objective",
    "SearchSpace",
    "load_search_space",
    "check_search_space",
    "evaluation_metric_names",
    "param_distribution",
    "suggest_overrides",
    "base_params",
    "overrides_list",
    "typed_value",
]

logger = logging.getLogger(__name__)

KINDS = ("float", "int", "categorical")
DIRECTIONS = ("maximize", "minimize")

#: keys every trial sets itself (its own folder, its seed): searching them would fight the study
RESERVED_KEYS = ("OUTPUT_DIR", "SEED")

_SECTIONS = ("objective", "pruner", "params")
_OBJECTIVE_FIELDS = ("metric", "direction")
_FIELDS = {
    "float": ("type", "low", "high", "log", "step"),
    "int": ("type", "low", "high", "log", "step"),
    "categorical": ("type", "choices"),
}
# ReidEvaluator's result names, in its order (tests/tune/test_space.py checks them against it).
_RANK_METRICS = ("Rank-1", "Rank-5", "Rank-10", "mAP", "mINP", "metric")


@dataclass(frozen=True)
class ParamSpec:
    """One searched config key: its kind ("float" | "int" | "categorical") and range or choices."""

    key: str
    kind: str
    low: Any = None
    high: Any = None
    log: bool = False
    step: Any = None
    choices: tuple = ()


@dataclass(frozen=True)
class Objective:
    """The evaluation result to optimize (``<test set>/<metric>``) and its direction."""

    metric: str
    direction: str


@dataclass(frozen=True)
class SearchSpace:
    """A loaded search space: the params in file order, the objective, the pruner and the file."""

    params: Tuple[ParamSpec, ...]
    objective: Objective
    pruner: str = "median"
    source: str = ""

    @property
    def keys(self) -> List[str]:
        """The searched config keys, in file order."""
        return [p.key for p in self.params]


# ----------------------------------------------------------------------------- loading


def load_search_space(path: str) -> SearchSpace:
    """Load and check a search-space YAML file on its own (no config needed).

    Args:
        path: the YAML file.
    Returns:
        the SearchSpace, params in file order (``source`` is the absolute path).
    Raises:
        ConfigError: one line naming the file, the key or field, and the fix.
    """
    source = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(source):
        raise ConfigError(f"Search space file not found: {source} (check the --search-space path).")
    try:
        with open(source, "r", encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"Search space {source} is not valid YAML: {first}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Search space {source} must be a mapping with the sections objective, params "
                          f"(and optionally pruner), got {type(data).__name__}.")
    for section in data:
        if section not in _SECTIONS:
            raise ConfigError(f"Search space {source}: unknown section '{section}': use "
                              f"{', '.join(_SECTIONS)}.{did_you_mean(str(section), list(_SECTIONS))}")
    for section in ("objective", "params"):
        if section not in data:
            raise ConfigError(f"Search space {source} has no '{section}' section: add it "
                              f"({_SECTION_HINTS[section]}).")
    objective = _load_objective(data["objective"], source)
    pruner = data.get("pruner", "median")
    if pruner is None or pruner is False:  # YAML reads a bare `none` as text, but `null` / `off` too
        pruner = "none"
    if pruner not in PRUNERS:
        raise ConfigError(f"Search space {source}: pruner '{pruner}' is unknown: use "
                          f"{', '.join(PRUNERS)}.{did_you_mean(str(pruner), list(PRUNERS))}")
    params = data["params"]
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"Search space {source}: 'params' must be a non-empty mapping of config keys, e.g. "
                          "SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}.")
    specs = tuple(_load_param(str(key), spec, source) for key, spec in params.items())
    return SearchSpace(params=specs, objective=objective, pruner=pruner, source=source)


_SECTION_HINTS = {
    "objective": "objective: {metric: SyntheticReID/mAP, direction: maximize}",
    "params": "params: {SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}}",
}


def _load_objective(node, source: str) -> Objective:
    where = f"Search space {source}: objective"
    if not isinstance(node, dict):
        raise ConfigError(f"{where} must be a mapping: {_SECTION_HINTS['objective']}.")
    for field in node:
        if field not in _OBJECTIVE_FIELDS:
            raise ConfigError(f"{where} has an unknown field '{field}': use metric and direction."
                              f"{did_you_mean(str(field), list(_OBJECTIVE_FIELDS))}")
    metric, direction = node.get("metric"), node.get("direction")
    if not isinstance(metric, str) or not metric.strip():
        raise ConfigError(f"{where}.metric is missing: name an evaluation result, e.g. metric: SyntheticReID/mAP.")
    if direction not in DIRECTIONS:
        got = "is missing" if direction is None else f"'{direction}' is unknown"
        raise ConfigError(f"{where}.direction {got}: use maximize or minimize."
                          f"{did_you_mean(str(direction), list(DIRECTIONS)) if direction is not None else ''}")
    return Objective(metric=metric.strip(), direction=direction)


def _load_param(key: str, spec, source: str) -> ParamSpec:
    where = f"Search space {source}: params.{key}"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a mapping such as {{type: float, low: 0.1, high: 0.5}}, "
                          f"got {type(spec).__name__} {spec!r}.")
    if "type" not in spec:
        if spec and all(isinstance(v, dict) for v in spec.values()):
            inner = next(iter(spec))
            raise ConfigError(f"{where} has no 'type': write each searched key in full, e.g. "
                              f"{key}.{inner}: {{type: ...}}, not nested sections.")
        raise ConfigError(f"{where} has no 'type': add type: float, int or categorical.")
    kind = spec["type"]
    if kind not in KINDS:
        raise ConfigError(f"{where}.type '{kind}' is unknown: use float, int or categorical."
                          f"{did_you_mean(str(kind), list(KINDS))}")
    for field in spec:
        if field not in _FIELDS[kind]:
            raise ConfigError(f"{where}: '{field}' is not a field of type {kind}: use "
                              f"{', '.join(_FIELDS[kind][1:])}.{did_you_mean(str(field), list(_FIELDS[kind]))}")
    if kind == "categorical":
        return ParamSpec(key=key, kind=kind, choices=_load_choices(key, spec.get("choices"), where))
    return _load_range(key, kind, spec, where)


def _load_choices(key: str, choices, where: str) -> tuple:
    if choices is None:
        raise ConfigError(f"{where} has no 'choices': add a list, e.g. choices: [2, 4, 8].")
    if not isinstance(choices, list) or not choices:
        raise ConfigError(f"{where}.choices must be a non-empty list, e.g. choices: [2, 4, 8]; got {choices!r}.")
    seen: List[Any] = []
    for choice in choices:
        if choice is not None and not isinstance(choice, (bool, int, float, str)):
            raise ConfigError(f"{where}: choice {choice!r} is a {type(choice).__name__}, not a scalar: choices "
                              "must be numbers, text, true/false or null (list-valued keys cannot be searched).")
        if choice in seen:
            raise ConfigError(f"{where}: choice {choice!r} is listed twice: list each value once.")
        seen.append(choice)
    return tuple(typed_value(key, c) for c in choices)


def _number(value, field: str, integer: bool, where: str):
    """A bound or step read as a number; text that reads as one is accepted (YAML reads 1e-4 as text)."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            pass
    if integer:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}.{field} must be an integer for type int, got {value!r}: "
                              "use whole numbers, or type: float.")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}.{field} must be a finite number, got {value!r}.")
    return float(value)


def _load_range(key: str, kind: str, spec: Mapping, where: str) -> ParamSpec:
    integer = kind == "int"
    for field in ("low", "high"):
        if field not in spec:
            raise ConfigError(f"{where} has no '{field}': type {kind} needs low and high.")
    low = _number(spec["low"], "low", integer, where)
    high = _number(spec["high"], "high", integer, where)
    if not low < high:
        raise ConfigError(f"{where}: low ({low}) must be below high ({high}): fix the bounds "
                          "(a single value is a fixed config key, not a search).")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log must be true or false, got {log!r}.")
    step = spec.get("step")
    if step is not None:
        step = _number(step, "step", integer, where)
        if log:
            raise ConfigError(f"{where}: log and step cannot be combined: drop one of them.")
        if step <= 0:
            raise ConfigError(f"{where}.step must be positive, got {step}.")
        count = (high - low) / step
        if abs(count - round(count)) > 1e-9 * max(1.0, abs(count)):
            fixed = low + math.floor(count) * step
            raise ConfigError(f"{where}: high - low ({high} - {low}) is not a multiple of step {step}: "
                              f"use high: {fixed:g} or another step.")
    if log and low <= 0:
        raise ConfigError(f"{where}: log needs low > 0, got low {low}: raise low or drop log.")
    if log and integer and low < 1:
        raise ConfigError(f"{where}: log needs low >= 1 for type int, got low {low}: raise low or drop log.")
    if integer and step is None:
        step = 1
    return ParamSpec(key=key, kind=kind, low=low, high=high, log=log, step=step)


# ----------------------------------------------------------------------------- checking


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
    for spec in space.params:
        _check_key(spec, cfg, leaves, where)
    _check_objective(space, cfg, where)
    for spec in space.params:
        for value in _candidate_values(spec):
            _check_value(spec.key, value, cfg, where)


def _check_key(spec: ParamSpec, cfg: CfgNode, leaves: List[str], where: str) -> None:
    key = spec.key
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
    if spec.kind == "categorical" or value is None:
        return
    if isinstance(value, bool) or isinstance(value, str):
        kind = "true/false" if isinstance(value, bool) else "text"
        raise ConfigError(f"{where}: params.{key} is a {kind} key (value {value!r}): use type: categorical "
                          "with choices.")
    if isinstance(value, int) and spec.kind == "float":
        raise ConfigError(f"{where}: params.{key} is an integer key (value {value!r}): use type: int "
                          "(or categorical).")


def _candidate_values(spec: ParamSpec) -> List[Any]:
    if spec.kind == "categorical":
        return list(spec.choices)
    return [spec.low, spec.high]


def _check_value(key: str, value, cfg: CfgNode, where: str) -> None:
    """Merge one value alone into a copy of cfg and run the config's own checks on it."""
    trial_cfg = cfg.clone()
    trial_cfg.defrost()
    try:
        trial_cfg.merge_from_dict(_nested(key, typed_value(key, value)), source=where)
        check_config_values(trial_cfg)
    except (ReidUserError, ValueError) as e:  # ConfigError, UnknownChoiceError, a builder's ValueError
        raise ConfigError(f"{where}: params.{key} value {value!r} fails the config check: {_one_line(e)}") from None


def _one_line(error: Exception) -> str:
    text = str(error.args[0]) if getattr(error, "args", None) else str(error)
    return " ".join(text.split())


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


def param_distribution(spec: ParamSpec):
    """The Optuna distribution of a param (what ``suggest_*`` records for it)."""
    optuna = require_optuna()
    dists = optuna.distributions
    if spec.kind == "float":
        return dists.FloatDistribution(spec.low, spec.high, log=spec.log, step=spec.step)
    if spec.kind == "int":
        return dists.IntDistribution(spec.low, spec.high, log=spec.log, step=spec.step or 1)
    return dists.CategoricalDistribution(list(spec.choices))


def suggest_overrides(trial, space: SearchSpace) -> Dict[str, Any]:
    """Ask the trial for a value of every param, in file order.

    Args:
        trial: an ``optuna.trial.Trial`` (enqueued values are returned as they are).
        space: the search space.
    Returns:
        {config key: value}, each typed like its config key.
    """
    params: Dict[str, Any] = {}
    for spec in space.params:
        if spec.kind == "float":
            value = trial.suggest_float(spec.key, spec.low, spec.high, log=spec.log, step=spec.step)
        elif spec.kind == "int":
            value = trial.suggest_int(spec.key, spec.low, spec.high, step=spec.step or 1, log=spec.log)
        else:
            value = trial.suggest_categorical(spec.key, list(spec.choices))
        params[spec.key] = typed_value(spec.key, value)
    return params


def base_params(space: SearchSpace, cfg: CfgNode) -> Dict[str, Any]:
    """The base config's own value of each searched key, to enqueue the base config as the first trial.

    A base value outside its param's range (or not among its choices, or off its step grid) is
    left out with one INFO line: Optuna samples that key in the first trial instead.

    Args:
        space: the search space.
        cfg: the base config.
    Returns:
        {config key: value}, in file order.
    """
    params: Dict[str, Any] = {}
    for spec in space.params:
        value = _lookup(cfg, spec.key)
        if value is _MISSING:
            continue
        inside = _inside(spec, typed_value(spec.key, value))
        if inside is _MISSING:
            logger.info("Search space: the base config's %s = %r is outside %s; the first trial samples it",
                        spec.key, value, _describe(spec))
            continue
        params[spec.key] = inside
    return params


def _inside(spec: ParamSpec, value):
    """`value` as the param records it when the param can take it, else _MISSING."""
    if spec.kind == "categorical":
        for choice in spec.choices:
            if type(choice) is type(value) and choice == value:
                return choice
        for choice in spec.choices:  # 4 for 4.0 and the like
            if choice == value and not isinstance(choice, bool) and not isinstance(value, bool):
                return choice
        return _MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not spec.low <= value <= spec.high:
        return _MISSING
    if spec.kind == "int" and not float(value).is_integer():
        return _MISSING
    if spec.step:
        count = (value - spec.low) / spec.step
        if abs(count - round(count)) > 1e-9 * max(1.0, abs(count)):
            return _MISSING
    return int(value) if spec.kind == "int" else float(value)


def _describe(spec: ParamSpec) -> str:
    if spec.kind == "categorical":
        return f"its choices {list(spec.choices)}"
    grid = f" step {spec.step:g}" if spec.step and spec.step != 1 else ""
    return f"[{spec.low:g}, {spec.high:g}]{grid}"


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
