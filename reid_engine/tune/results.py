"""What a study found: the table of the best trials, the plots, and the best trial's config.

Reads only the study (trials, their params, values, intermediate values and user attrs), so it
works the same on a running study, a finished one, or one loaded from another machine's
storage. An interrupted attempt that a later trial continues (user attr ``resumes_trial``) is
not listed: the continuation is, as ``#7 (continues #3)``, with the attempts' times summed.
"""
import logging
import math
import os
import sys
import warnings
from typing import Any, Dict, List, Optional, Sequence

from tabulate import tabulate

from ..config import CfgNode
from ..utils.errors import ReidUserError, require_module
from .space import SearchSpace, overrides_list, typed_value
from .study import continued_attempts, format_params, require_optuna

__all__ = [
    "SUMMARY_FILE",
    "BEST_CONFIG_FILE",
    "PLOT_FILES",
    "ranked_trials",
    "best_trial",
    "trials_table",
    "write_plots",
    "best_config",
    "write_best_config",
    "write_summary",
]

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.md"
BEST_CONFIG_FILE = "best_config.yaml"
PLOT_FILES = ("optimization_history.png", "param_importances.png", "intermediate_values.png")


# ----------------------------------------------------------------------------- ranking


def _state_name(trial) -> str:
    return trial.state.name  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING


def _last_intermediate(trial):
    """(step, value) of the last reported intermediate value, or None."""
    if not trial.intermediate_values:
        return None
    step = max(trial.intermediate_values)
    return step, trial.intermediate_values[step]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def ranked_trials(study, space: SearchSpace) -> List[Any]:
    """The finished trials, best first, as the table lists them.

    COMPLETE trials by their value, then PRUNED ones by their last reported value (both in the
    objective's direction), then FAIL ones by number; an attempt that a later trial continues,
    and trials still running or waiting, are left out.

    Args:
        study: an ``optuna.Study``.
        space: its search space (the objective's direction).
    Returns:
        a list of ``optuna.trial.FrozenTrial``.
    """
    trials = study.get_trials(deepcopy=False)
    continued = continued_attempts(trials)
    sign = -1.0 if space.objective.direction == "maximize" else 1.0

    def by_value(value):
        return (0, sign * value) if _is_number(value) else (1, 0.0)  # NaN / missing last

    complete, pruned, failed = [], [], []
    for t in trials:
        state = _state_name(t)
        if state == "COMPLETE":
            complete.append(t)
        elif state == "PRUNED":
            pruned.append(t)
        elif state == "FAIL" and t.number not in continued:
            failed.append(t)
    complete.sort(key=lambda t: (by_value(t.value), t.number))
    pruned.sort(key=lambda t: (by_value((_last_intermediate(t) or (0, None))[1]), t.number))
    failed.sort(key=lambda t: t.number)
    return complete + pruned + failed


def best_trial(study, space: SearchSpace):
    """The COMPLETE trial with the best objective value, or None when no trial has completed."""
    ranked = ranked_trials(study, space)
    if ranked and _state_name(ranked[0]) == "COMPLETE" and _is_number(ranked[0].value):
        return ranked[0]
    return None


# ----------------------------------------------------------------------------- the table


def _short_names(keys: Sequence[str]) -> Dict[str, str]:
    """Column names: the last key component, longer where two keys would share one."""
    depth = {k: 1 for k in keys}
    while True:
        names = {k: ".".join(k.split(".")[-depth[k]:]) for k in keys}
        clashes = [k for k in keys if list(names.values()).count(names[k]) > 1 and depth[k] < len(k.split("."))]
        if not clashes:
            return names
        for k in clashes:
            depth[k] += 1


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _attempts(trial, by_number: Dict[int, Any]) -> List[Any]:
    """The trial and the attempts it continues, newest first."""
    chain, seen = [trial], {trial.number}
    resumed = trial.user_attrs.get("resumes_trial")
    while resumed is not None and int(resumed) in by_number and int(resumed) not in seen:
        attempt = by_number[int(resumed)]
        chain.append(attempt)
        seen.add(attempt.number)
        resumed = attempt.user_attrs.get("resumes_trial")
    return chain


def _duration_s(chain: Sequence[Any]) -> Optional[float]:
    total, known = 0.0, False
    for t in chain:
        if t.datetime_start is not None and t.datetime_complete is not None:
            total += (t.datetime_complete - t.datetime_start).total_seconds()
            known = True
    return total if known else None


def _relative(path: Optional[str], relative_to: Optional[str]) -> str:
    if not path:
        return "-"
    base = os.path.abspath(relative_to or os.getcwd())
    rel = os.path.relpath(os.path.abspath(path), base)
    return path if rel.startswith("..") else rel


def _state_cell(trial) -> str:
    state = _state_name(trial)
    if state == "COMPLETE":
        return "complete"
    if state == "PRUNED":
        last = _last_intermediate(trial)
        return f"pruned at {last[0]}" if last else "pruned"
    return str(trial.user_attrs.get("status") or "failed")


def _value_cell(trial) -> str:
    state = _state_name(trial)
    if state == "COMPLETE":
        value = trial.value
    elif state == "PRUNED":
        value = (_last_intermediate(trial) or (None, None))[1]
    else:
        value = None
    return f"{value:#.4g}" if _is_number(value) else "-"  # 4 significant digits, zeros kept: 70.00


def _counts_line(study, space: SearchSpace) -> str:
    trials = study.get_trials(deepcopy=False)
    continued = continued_attempts(trials)
    states = [_state_name(t) for t in trials if t.number not in continued]
    finished = sum(s in ("COMPLETE", "PRUNED", "FAIL") for s in states)
    planned = study.user_attrs.get("n_trials")
    of = f" of {planned}" if planned else ""
    parts = [f"{states.count('COMPLETE')} complete", f"{states.count('PRUNED')} pruned",
             f"{states.count('FAIL')} failed"]
    if states.count("RUNNING"):
        parts.append(f"{states.count('RUNNING')} running")
    waiting = sum(_state_name(t) == "WAITING" and t.user_attrs.get("resumes_trial") is not None for t in trials)
    if waiting:
        parts.append(f"{waiting} interrupted, waiting to be continued")
    return (f"Study {study.study_name}: {finished}{of} trials finished ({', '.join(parts)}); "
            f"objective {space.objective.metric} ({space.objective.direction})")


def trials_table(study, space: SearchSpace, top: int = 10, tablefmt: str = "simple",
                 relative_to: Optional[str] = None) -> str:
    """The best finished trials as a text table, under a line with the study's counts.

    Columns: rank, trial (``#7 (continues #3)`` for a continuation), state (complete, ``pruned at
    <iteration>``, failed), the objective (4 significant digits; a pruned trial's last reported
    value), each param (its key's last component), iterations, duration (all attempts) and output
    folder. A failed trial's error follows the table.

    Args:
        study: an ``optuna.Study``.
        space: its search space.
        top: how many trials to list; 0 or None lists all.
        tablefmt: a ``tabulate`` format ("simple" for a terminal, "github" for Markdown).
        relative_to: output folders are shown relative to this folder (default: the current one).
    Returns:
        the text; "no trial has finished yet" in place of the table when none has.
    """
    header = _counts_line(study, space)
    ranked = ranked_trials(study, space)
    if not ranked:
        return f"{header}\nno trial has finished yet"
    shown = ranked[:top] if top and top > 0 else ranked
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    names = _short_names(space.keys)
    metric_name = space.objective.metric.rsplit("/", 1)[-1]
    headers = ["rank", "trial", "state", metric_name] + [names[k] for k in space.keys] + ["iters", "time", "output"]
    rows = []
    for rank, t in enumerate(shown, 1):
        resumed = t.user_attrs.get("resumes_trial")
        label = f"#{t.number}" + (f" (continues #{resumed})" if resumed is not None else "")
        params = [_format_value(typed_value(k, t.params[k])) if k in t.params else "-" for k in space.keys]
        rows.append([str(rank), label, _state_cell(t), _value_cell(t)] + params + [
            _format_value(t.user_attrs.get("iterations")),
            _format_duration(_duration_s(_attempts(t, by_number))),
            _relative(t.user_attrs.get("output_dir"), relative_to),
        ])
    align = ["right", "left", "left", "right"] + ["right"] * len(space.keys) + ["right", "right", "left"]
    table = tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True, colalign=align)
    markdown = tablefmt in ("github", "pipe")
    lines = [header]
    if len(shown) < len(ranked):
        lines.append(f"best {len(shown)} of {len(ranked)} finished trials:")
    lines += [""] * markdown + [table] + [""] * markdown  # a Markdown table stands in its own block
    for t in shown:
        error = t.user_attrs.get("error")
        if _state_name(t) == "FAIL" and error:
            lines.append("- " * markdown + f"#{t.number} {_state_cell(t)}: {' '.join(str(error).split())}")
    return "\n".join(lines).rstrip("\n")


# ----------------------------------------------------------------------------- plots


def _use_agg_backend() -> None:
    """Draw on the Agg canvas (no display) unless the program already chose a pyplot backend."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")


def _save_axes(axes, path: str) -> str:
    import matplotlib.pyplot as plt

    first = axes.flat[0] if hasattr(axes, "flat") else axes
    figure = first.figure
    try:
        figure.savefig(path, bbox_inches="tight", dpi=100)
    finally:
        plt.close(figure)
    return path


def _labelled(axes, xlabel: str, ylabel: str):
    """The axes with the study's own names on them (Optuna writes "Step", "Intermediate Value")."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    return axes


def _importance_skip_reason(complete: Sequence[Any], space: SearchSpace) -> Optional[str]:
    """Why param importances cannot be computed from these COMPLETE trials, or None."""
    if len(complete) < 2:
        return f"importances need at least 2 complete trials, the study has {len(complete)}"
    common = [k for k in space.keys if all(k in t.params for t in complete)]
    if not common:
        return "no searched param is set in every complete trial"
    if not any(len({repr(t.params[k]) for t in complete}) > 1 for k in common):
        return "every complete trial has the same params (nothing varied yet)"
    try:
        import sklearn  # noqa: F401  (Optuna's fANOVA evaluator fits a random forest)
    except ImportError:
        return "importances need scikit-learn (pip install scikit-learn)"
    return None


def write_plots(study, space: SearchSpace, out_dir: str) -> List[str]:
    """Draw the study's plots as PNG files with Optuna's matplotlib plots.

    ``optimization_history.png`` (when a trial has completed), ``param_importances.png`` (at least
    two complete trials and one varied param; fANOVA with a fixed seed) and
    ``intermediate_values.png`` (when a trial reported evaluations). A plot that is skipped or
    fails is one INFO / WARNING line; the others are still written.

    Args:
        study: an ``optuna.Study``.
        space: its search space (the objective's name labels the value axis).
        out_dir: the folder to write into (created).
    Returns:
        the paths written.
    """
    optuna = require_optuna()
    require_module("matplotlib", "reid-tune's plots")
    _use_agg_backend()
    from optuna.visualization import matplotlib as optuna_plots

    os.makedirs(out_dir, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if _state_name(t) == "COMPLETE" and _is_number(t.value)]
    target = space.objective.metric
    plans = [
        (PLOT_FILES[0], None if complete else "no trial has completed yet",
         lambda: optuna_plots.plot_optimization_history(study, target_name=target)),
        (PLOT_FILES[1], _importance_skip_reason(complete, space),
         lambda: optuna_plots.plot_param_importances(
             study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), target_name=target)),
        (PLOT_FILES[2], None if any(t.intermediate_values for t in trials) else "no trial reported an evaluation",
         lambda: _labelled(optuna_plots.plot_intermediate_values(study), "Iteration", target)),
    ]
    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for name, skip_reason, draw in plans:
            path = os.path.join(out_dir, name)
            if skip_reason:
                logger.info("%s skipped: %s", name, skip_reason)
                continue
            try:
                written.append(_save_axes(draw(), path))
            except Exception as e:  # a picture must not lose the summary of a finished study
                logger.warning("%s not drawn (%s: %s); the table and best config are unaffected",
                               name, type(e).__name__, " ".join(str(e).split()))
    return written


# ----------------------------------------------------------------------------- best config


def _best_or_raise(study, space: SearchSpace):
    trial = best_trial(study, space)
    if trial is None:
        raise ReidUserError(f"Study {study.study_name} has no complete trial yet, so there is no best config: "
                            "let the study run more trials (run the same reid-tune command again)")
    return trial


def _best_params(trial, space: SearchSpace) -> Dict[str, Any]:
    return {k: typed_value(k, trial.params[k]) for k in space.keys if k in trial.params}


def best_config(study, space: SearchSpace, base_cfg: CfgNode, output_dir: Optional[str] = None) -> CfgNode:
    """The base config with the best trial's params merged in.

    Args:
        study: an ``optuna.Study`` with at least one COMPLETE trial.
        space: its search space (keys the best trial lacks keep the base value).
        base_cfg: the study's base config (the trials' config without their params).
        output_dir: OUTPUT_DIR of the result; default ``<base OUTPUT_DIR>/<study name>/best``.
    Returns:
        a frozen CfgNode.
    Raises:
        ReidUserError: no trial has completed yet.
    """
    trial = _best_or_raise(study, space)
    cfg = base_cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(overrides_list(_best_params(trial, space)))
    cfg.OUTPUT_DIR = output_dir or os.path.join(base_cfg.OUTPUT_DIR, study.study_name, "best")
    cfg.freeze()
    return cfg


def write_best_config(study, space: SearchSpace, base_cfg: CfgNode, path: str) -> str:
    """Write the best config as a YAML file that ``reid-train --config-file`` trains as it is.

    A comment header names the study, the trial, its objective value and seed, and the overrides.
    OUTPUT_DIR is ``best/`` next to the file.

    Args:
        study, space, base_cfg: as for :func:`best_config`.
        path: the YAML file to write (its folder is created).
    Returns:
        the path.
    """
    trial = _best_or_raise(study, space)
    folder = os.path.dirname(os.path.abspath(path))
    cfg = best_config(study, space, base_cfg, output_dir=os.path.join(folder, "best"))
    params = _best_params(trial, space)
    resumed = trial.user_attrs.get("resumes_trial")
    seed = trial.user_attrs.get("seed")
    header = [
        f"# Best trial of the reid-tune study '{study.study_name}': #{trial.number}"
        + (f" (continues #{resumed})" if resumed is not None else "")
        + f", {space.objective.metric} = {trial.value:.4g} ({space.objective.direction})"
        + (f", trained with SEED {seed}" if seed is not None else ""),
        "# The study's base config with these overrides (and OUTPUT_DIR below):",
        "#   " + (" ".join(overrides_list(params)) or "(none: the base config won)"),
        f"# Train it: reid-train --config-file {path}",
    ]
    missing = [k for k in space.keys if k not in params]
    if missing:
        header.append(f"# Not set by this trial (base values kept): {', '.join(missing)}")
    os.makedirs(folder, exist_ok=True)
    text = "\n".join(header) + "\n" + cfg.dump()
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)  # a reader never sees half a file
    logger.info("Best config (trial #%d: %s) written to %s", trial.number, format_params(params), path)
    return path


# ----------------------------------------------------------------------------- summary


def write_summary(study, space: SearchSpace, base_cfg: CfgNode, out_dir: str) -> str:
    """Write the study's summary into `out_dir`: summary.md (all finished trials), the plots and
    best_config.yaml (when a trial has completed).

    Args:
        study: an ``optuna.Study``.
        space: its search space.
        base_cfg: the base config (for the best config).
        out_dir: the study folder (created).
    Returns:
        the text to print: the top-10 table and the paths written.
    """
    os.makedirs(out_dir, exist_ok=True)
    plots = write_plots(study, space, out_dir)
    best_path = None
    if best_trial(study, space) is not None:
        best_path = write_best_config(study, space, base_cfg, os.path.join(out_dir, BEST_CONFIG_FILE))
    summary_path = os.path.join(out_dir, SUMMARY_FILE)
    md = [f"# reid-tune study `{study.study_name}`", ""]
    if space.source:
        md += [f"Search space: `{space.source}`", ""]
    md += [trials_table(study, space, top=0, tablefmt="github", relative_to=out_dir), ""]
    if best_path:
        md += [f"Best config: [`{BEST_CONFIG_FILE}`]({BEST_CONFIG_FILE}) "
               f"(train it: `reid-train --config-file {best_path}`)", ""]
    md += [f"![{os.path.splitext(os.path.basename(p))[0]}]({os.path.basename(p)})" for p in plots]
    tmp = f"{summary_path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(md).rstrip() + "\n")
    os.replace(tmp, summary_path)

    lines = [trials_table(study, space, top=10), ""]
    if best_path:
        lines.append(f"Best config: {best_path}  (train it: reid-train --config-file {best_path})")
    else:
        lines.append("Best config: not written yet (no trial has completed)")
    if plots:
        lines.append(f"Plots: {', '.join(plots)}")
    lines.append(f"Summary: {summary_path}")
    return "\n".join(lines)
