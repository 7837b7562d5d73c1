"""What a study found: the table of its trials (``trials_dataframe()``), its best trial's config
(``study.best_trial``) and Optuna's matplotlib plots.

Reads only the study, so it works on a running study, a finished one, or one loaded from another
machine's storage. An attempt that a retry continues is not listed: the retry is, as
``#7 (continues #3)``, with the attempts' times summed.
"""
import logging
import math
import os
import sys
import warnings
from typing import Any, Dict, List, Optional

import pandas
from tabulate import tabulate

from ..config import CfgNode
from ..utils.errors import ReidUserError, first_line
from ..utils.file_io import atomic_write_text
from .space import SearchSpace, overrides_list, typed_value
from .study import continued_attempts, finished_trials, format_params, require_optuna, retried_from

__all__ = ["SUMMARY_FILE", "BEST_CONFIG_FILE", "PLOT_FILES", "trials_table", "write_plots", "best_config",
           "write_best_config", "write_summary"]

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.md"
BEST_CONFIG_FILE = "best_config.yaml"
PLOT_FILES = ("optimization_history.png", "param_importances.png", "intermediate_values.png")


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _rows(study, space: SearchSpace) -> List[Dict[str, Any]]:
    """The finished trials not continued by another, best first: complete by value, pruned by their
    last evaluation, then failed by number (rows of ``trials_dataframe()``, with their retry)."""
    trials = study.get_trials(deepcopy=False)
    continued = continued_attempts(trials)
    frame = study.trials_dataframe(attrs=("number", "value", "duration", "params", "user_attrs", "state"),
                                   multi_index=False)
    rows = []
    for row in frame.to_dict("records"):
        if row["state"] not in ("COMPLETE", "PRUNED", "FAIL") or row["number"] in continued:
            continue
        chain = [row["number"]] + list(trials[row["number"]].system_attrs.get("retry_history", []))
        row["time"] = sum(frame["duration"][n].total_seconds() for n in chain if pandas.notna(frame["duration"][n]))
        row["resumes"] = retried_from(trials[row["number"]])
        values = trials[row["number"]].intermediate_values
        row["last"] = (max(values), values[max(values)]) if values else None  # a pruned trial's last evaluation
        row["shown"] = row["value"] if row["state"] == "COMPLETE" else (row["last"] or (0, None))[1]
        rows.append(row)
    sign = -1.0 if space.objective.direction == "maximize" else 1.0
    order = {"COMPLETE": 0, "PRUNED": 1, "FAIL": 2}

    def key(row):
        value = row["shown"]
        known = row["state"] != "FAIL" and isinstance(value, float) and not math.isnan(value)
        return order[row["state"]], not known, sign * value if known else 0.0, row["number"]

    return sorted(rows, key=key)


def _short_names(keys: List[str]) -> Dict[str, str]:
    """Column names: the last key component, longer where two keys would share one."""
    depth = dict.fromkeys(keys, 1)
    while True:
        names = {k: ".".join(k.split(".")[-depth[k]:]) for k in keys}
        clashes = [k for k in keys if list(names.values()).count(names[k]) > 1 and depth[k] < len(k.split("."))]
        if not clashes:
            return names
        for k in clashes:
            depth[k] += 1


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _header(study, space: SearchSpace) -> str:
    """``Study demo: 7 of 10 trials finished (3 complete, 3 pruned, 1 failed, 1 running); objective ...``."""
    trials = study.get_trials(deepcopy=False)
    finished = [t.state.name for t in finished_trials(trials)]
    running = sum(t.state.name == "RUNNING" for t in trials)
    waiting = sum(t.state.name == "WAITING" and retried_from(t) is not None for t in trials)
    parts = [f"{finished.count('COMPLETE')} complete", f"{finished.count('PRUNED')} pruned",
             f"{finished.count('FAIL')} failed"] + [f"{running} running"] * bool(running) + [
        f"{waiting} interrupted, waiting to be continued"] * bool(waiting)
    planned = f" of {study.user_attrs['n_trials']}" if "n_trials" in study.user_attrs else ""
    return (f"Study {study.study_name}: {len(finished)}{planned} trials finished ({', '.join(parts)}); "
            f"objective {space.objective.metric} ({space.objective.direction})")


def trials_table(study, space: SearchSpace, top: int = 10, tablefmt: str = "simple",
                 relative_to: Optional[str] = None) -> str:
    """The best `top` finished trials (0: all) as a `tablefmt` table under the study's progress line;
    a failed trial's error follows. Output folders are relative to `relative_to` (default: here)."""
    header = _header(study, space)
    ranked = _rows(study, space)
    if not ranked:
        return f"{header}\nno trial has finished yet"
    shown = ranked[:top] if top else ranked
    names = _short_names(space.keys)
    headers = ["rank", "trial", "state", space.objective.metric.rsplit("/", 1)[-1], *names.values(), "iters", "time",
               "output"]
    table, errors = [], []
    for rank, row in enumerate(shown, 1):
        last = row["last"]
        state = {"COMPLETE": "complete", "PRUNED": f"pruned at {last[0]}" if last else "pruned"}.get(
            row["state"], row.get("user_attrs_status") if isinstance(row.get("user_attrs_status"), str) else "failed")
        out = row.get("user_attrs_output_dir")
        if isinstance(out, str):
            rel = os.path.relpath(out, os.path.abspath(relative_to or os.getcwd()))
            out = out if rel.startswith("..") else rel
        iters = row.get("user_attrs_iterations")
        table.append([str(rank), f"#{row['number']}" + (f" (continues #{row['resumes']})" if row["resumes"] is not None
                                                   else ""), state,
                      f"{row['shown']:#.4g}" if isinstance(row["shown"], float) and row["state"] != "FAIL" else "-",
                      *[_cell(typed_value(k, row.get(f"params_{k}"))) for k in space.keys],
                      _cell(int(iters) if iters is not None and pandas.notna(iters) else None),
                      _duration(row["time"]), _cell(out)])
        if row["state"] == "FAIL" and isinstance(row.get("user_attrs_error"), str):
            errors.append(f"#{row['number']} {state}: {' '.join(row['user_attrs_error'].split())}")
    markdown = tablefmt in ("github", "pipe")
    lines = [header] + ([f"best {len(shown)} of {len(ranked)} finished trials:"] if len(shown) < len(ranked) else [])
    align = ["right", "left", "left"] + ["right"] * (len(headers) - 4) + ["left"]
    lines += [""] * markdown + [tabulate(table, headers=headers, tablefmt=tablefmt, disable_numparse=True,
                                         colalign=align)]
    lines += [""] * markdown + ["- " * markdown + e for e in errors]
    return "\n".join(lines).rstrip("\n")


def write_plots(study, space: SearchSpace, out_dir: str) -> List[str]:
    """Optuna's matplotlib plots as PNG files: the optimization history, the param importances
    (fANOVA, seeded; needs 2 complete trials with a varied value) and the intermediate values.
    A plot that cannot be drawn (or no matplotlib) is one log line; returns the paths written."""
    optuna = require_optuna()
    try:
        import matplotlib

        if "matplotlib.pyplot" not in sys.modules:
            matplotlib.use("Agg")  # no display
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as plots
    except ImportError as e:
        logger.warning("No plots: %s (pip install 'reid_engine[tune]' brings matplotlib)", first_line(e))
        return []
    os.makedirs(out_dir, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    varied = any(len({repr(t.params.get(k)) for t in complete}) > 1 for k in space.keys)
    target = space.objective.metric

    def intermediate():
        axes = plots.plot_intermediate_values(study)
        axes.set_xlabel("Iteration")
        axes.set_ylabel(target)
        return axes

    plans = [(PLOT_FILES[0], "no trial has completed yet" if not complete else None,
              lambda: plots.plot_optimization_history(study, target_name=target)),
             (PLOT_FILES[1], None if len(complete) >= 2 and varied else
              "importances need 2 complete trials in which some value differs",
              lambda: plots.plot_param_importances(study, target_name=target,
                                                   evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))),
             (PLOT_FILES[2], None if any(t.intermediate_values for t in trials) else "no trial reported an evaluation",
              intermediate)]
    written = []
    for name, skip, draw in plans:
        if skip:
            logger.info("%s skipped: %s", name, skip)
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                figure = draw().figure
            figure.savefig(os.path.join(out_dir, name), bbox_inches="tight", dpi=100)
            plt.close(figure)
            written.append(os.path.join(out_dir, name))
        except Exception as e:  # noqa: BLE001 - a picture must not lose the summary of a finished study
            logger.warning("%s not drawn (%s: %s); the table and best config are unaffected", name,
                           type(e).__name__, first_line(e))
    return written


def _best(study):
    try:
        return study.best_trial
    except ValueError:  # no complete trial
        return None


def best_config(study, space: SearchSpace, base_cfg: CfgNode, output_dir: Optional[str] = None) -> CfgNode:
    """The base config with the best trial's values merged in (OUTPUT_DIR `output_dir`, default
    ``<base OUTPUT_DIR>/<study>/best``). Raises ReidUserError when no trial has completed."""
    trial = _best(study)
    if trial is None:
        raise ReidUserError(f"Study {study.study_name} has no complete trial yet, so there is no best config: "
                            "let the study run more trials (run the same reid-tune command again)")
    cfg = base_cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(overrides_list(_params(trial, space)))
    cfg.OUTPUT_DIR = output_dir or os.path.join(base_cfg.OUTPUT_DIR, study.study_name, "best")
    cfg.freeze()
    return cfg


def _params(trial, space: SearchSpace) -> Dict[str, Any]:
    return {k: typed_value(k, trial.params[k]) for k in space.keys if k in trial.params}


def write_best_config(study, space: SearchSpace, base_cfg: CfgNode, path: str) -> str:
    """Write the best config as a YAML file that ``reid-train --config-file`` trains as it is, under a
    comment header (study, trial, value, seed, overrides); its OUTPUT_DIR is ``best/`` beside it."""
    folder = os.path.dirname(os.path.abspath(path))
    cfg = best_config(study, space, base_cfg, output_dir=os.path.join(folder, "best"))
    trial, params = study.best_trial, _params(study.best_trial, space)
    resumed, seed = retried_from(trial), trial.user_attrs.get("seed")
    header = [f"# Best trial of the reid-tune study '{study.study_name}': #{trial.number}"
              + (f" (continues #{resumed})" if resumed is not None else "")
              + f", {space.objective.metric} = {trial.value:.4g} ({space.objective.direction})"
              + (f", trained with SEED {seed}" if seed is not None else ""),
              "# The study's base config with these overrides (and OUTPUT_DIR below):",
              "#   " + (" ".join(overrides_list(params)) or "(none: the base config won)"),
              f"# Train it: reid-train --config-file {path}"]
    missing = [k for k in space.keys if k not in params]
    if missing:
        header.append(f"# Not set by this trial (base values kept): {', '.join(missing)}")
    atomic_write_text(path, "\n".join(header) + "\n" + cfg.dump())
    logger.info("Best config (trial #%d: %s) written to %s", trial.number, format_params(params), path)
    return path


def write_summary(study, space: SearchSpace, base_cfg: CfgNode, out_dir: str) -> str:
    """Write summary.md (all finished trials), best_config.yaml (once a trial has completed), then the
    plots into `out_dir`; returns the text to print (the top-10 table and the paths)."""
    os.makedirs(out_dir, exist_ok=True)
    best = os.path.join(out_dir, BEST_CONFIG_FILE) if _best(study) is not None else None
    if best:
        write_best_config(study, space, base_cfg, best)
    summary = os.path.join(out_dir, SUMMARY_FILE)
    md = [f"# reid-tune study `{study.study_name}`", "", f"Search space: `{space.source}`", "",
          trials_table(study, space, top=0, tablefmt="github", relative_to=out_dir), ""]
    if best:
        md += [f"Best config: [`{BEST_CONFIG_FILE}`]({BEST_CONFIG_FILE}) (train it: `reid-train --config-file "
               f"{best}`)", ""]
    atomic_write_text(summary, "\n".join(md) + "\n")
    plots = write_plots(study, space, out_dir)
    if plots:
        atomic_write_text(summary, "\n".join(md + [f"![{os.path.splitext(os.path.basename(p))[0]}]"
                                                   f"({os.path.basename(p)})" for p in plots]) + "\n")
    lines = [trials_table(study, space, top=10), "",
             f"Best config: {best}  (train it: reid-train --config-file {best})" if best else
             "Best config: not written yet (no trial has completed)"]
    if plots:
        lines.append(f"Plots: {', '.join(plots)}")
    lines.append(f"Summary: {summary}")
    return "\n".join(lines)
