"""What a study found, from the study alone: the table of its trials (``trials_dataframe()``; a retry
is listed as ``#7 (continues #3)``, with its attempts' times summed), the best trial's config and
Optuna's matplotlib plots."""
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
from .study import finished_trials, format_params, require_optuna, retried_from, retry_of, study_progress

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
    """The trials that count (finished, not continued), best first: complete by value, pruned by their last
    evaluation, then failed by number; rows of ``trials_dataframe()`` with their retry and summed time."""
    frame = study.trials_dataframe(attrs=("number", "value", "duration", "params", "user_attrs", "state"),
                                   multi_index=False)
    records = frame.to_dict("records")  # row n is trial #n
    rows = []
    for trial in finished_trials(study.get_trials(deepcopy=False)):
        row, history, steps = records[trial.number], retry_of(trial)[1], trial.intermediate_values
        row["time"] = sum(records[n]["duration"].total_seconds() for n in [trial.number, *history]
                          if pandas.notna(records[n]["duration"]))
        row["resumes"] = history[-1] if history else None
        row["last"] = (max(steps), steps[max(steps)]) if steps else None  # a pruned trial's last evaluation
        shown = trial.value if row["state"] == "COMPLETE" else (row["last"] or (0, None))[1]
        row["shown"] = shown if row["state"] != "FAIL" and shown is not None and not math.isnan(shown) else None
        rows.append(row)
    sign, order = -1.0 if space.objective.direction == "maximize" else 1.0, {"COMPLETE": 0, "PRUNED": 1, "FAIL": 2}
    return sorted(rows, key=lambda r: (order[r["state"]], r["shown"] is None, sign * (r["shown"] or 0.0), r["number"]))


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


def trials_table(study, space: SearchSpace, top: int = 10, tablefmt: str = "simple",
                 relative_to: Optional[str] = None) -> str:
    """The best `top` finished trials (0: all) as a `tablefmt` table under the study's progress line;
    a failed trial's error follows. Output folders are relative to `relative_to` (default: here)."""
    header = (f"Study {study.study_name}: {study_progress(study, best=False)}; "
              f"objective {space.objective.metric} ({space.objective.direction})")
    ranked = _rows(study, space)
    if not ranked:
        return f"{header}\nno trial has finished yet"
    shown = ranked[:top] if top else ranked
    names = _short_names(space.keys)
    headers = ["rank", "trial", "state", space.objective.metric.rsplit("/", 1)[-1], *names.values(), "iters", "time",
               "output"]
    table, errors = [], []
    for rank, row in enumerate(shown, 1):
        status, out, iters = (row.get(f"user_attrs_{k}") for k in ("status", "output_dir", "iterations"))
        state = {"COMPLETE": "complete", "PRUNED": f"pruned at {row['last'][0]}" if row["last"] else "pruned"}.get(
            row["state"], status if isinstance(status, str) else "failed")
        if isinstance(out, str) and not os.path.relpath(out, os.path.abspath(relative_to or ".")).startswith(".."):
            out = os.path.relpath(out, os.path.abspath(relative_to or "."))
        resumes = f" (continues #{row['resumes']})" if row["resumes"] is not None else ""
        table.append([str(rank), f"#{row['number']}{resumes}", state, "-" if row["shown"] is None else
                      f"{row['shown']:#.4g}", *[_cell(typed_value(k, row.get(f"params_{k}"))) for k in space.keys],
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
