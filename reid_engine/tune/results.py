"""What a study found, from the study alone: the table of its trials (pandas on ``trials_dataframe()``;
a retry is listed as ``#7 (continues #3)``, with its attempts' times summed), the best trial's config and
Optuna's matplotlib plots."""
import logging
import os
import sys
from typing import List, Optional

import pandas
from tabulate import tabulate

from ..config import CfgNode
from ..utils.errors import ReidUserError, first_line
from ..utils.file_io import atomic_write_text
from .space import SearchSpace, overrides_list, typed_value
from .study import finished_trials, format_params, require_optuna, retried_from, retry_of, study_progress

__all__ = ["SUMMARY_FILE", "BEST_CONFIG_FILE", "PLOT_FILES", "trials_table", "write_plots", "write_best_config",
           "write_summary"]

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.md"
BEST_CONFIG_FILE = "best_config.yaml"
PLOT_FILES = ("optimization_history.png", "param_importances.png", "intermediate_values.png")


def _ranked(study, space: SearchSpace) -> pandas.DataFrame:
    """The rows of ``trials_dataframe()`` that count (finished, not continued), best first: complete by value,
    pruned by their last evaluation (``shown``), failed by number; with ``time`` (all attempts), ``resumes``."""
    counted = {t.number: t for t in finished_trials(study.get_trials(deepcopy=False))}
    if not counted:
        return pandas.DataFrame()
    frame = study.trials_dataframe(attrs=("number", "value", "duration", "params", "user_attrs", "state"),
                                   multi_index=False).set_index("number", drop=False).rename_axis(None)
    seconds = pandas.to_timedelta(frame["duration"]).dt.total_seconds().fillna(0.0)
    rows = frame.loc[list(counted)].copy()
    history = {n: retry_of(t)[1] for n, t in counted.items()}
    rows["time"] = [seconds[[n, *history[n]]].sum() for n in rows.index]
    rows["resumes"] = [(history[n] or [None])[-1] for n in rows.index]
    rows["last_step"] = [max(t.intermediate_values, default=None) for t in counted.values()]
    last_value = [t.intermediate_values.get(step) for t, step in zip(counted.values(), rows["last_step"])]
    rows["shown"] = rows["value"].where(rows["state"] == "COMPLETE", pandas.Series(last_value, rows.index, float))
    rows.loc[rows["state"] == "FAIL", "shown"] = float("nan")
    rows["order"] = rows["state"].map({"COMPLETE": 0, "PRUNED": 1, "FAIL": 2})
    return rows.sort_values(["order", "shown", "number"], na_position="last",
                            ascending=[True, space.objective.direction == "minimize", True])


def _short_names(keys: List[str]) -> List[str]:
    """Column names: the last key component, the last two where keys share it."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return [name if last.count(name) == 1 else ".".join(k.split(".")[-2:]) for k, name in zip(keys, last)]


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and pandas.isna(value)):
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def trials_table(study, space: SearchSpace, top: int = 10, tablefmt: str = "simple",
                 relative_to: Optional[str] = None) -> str:
    """The best `top` finished trials (0: all) as a `tablefmt` table under the study's progress line;
    a failed trial's error follows. Output folders are relative to `relative_to` (default: here)."""
    header = (f"Study {study.study_name}: {study_progress(study, best=False)}; "
              f"objective {space.objective.metric} ({space.objective.direction})")
    ranked = _ranked(study, space)
    if ranked.empty:
        return f"{header}\nno trial has finished yet"
    shown, here = ranked.head(top) if top else ranked, os.path.abspath(relative_to or ".")
    headers = ["rank", "trial", "state", space.objective.metric.rsplit("/", 1)[-1],
               *_short_names(space.keys), "iters", "time", "output"]
    table, errors = [], []
    for rank, (_, row) in enumerate(shown.iterrows(), 1):
        status, out, iters, error = (row.get(f"user_attrs_{k}") for k in ("status", "output_dir", "iterations", "error"))
        state = {"COMPLETE": "complete", "PRUNED": "pruned" + (f" at {int(row['last_step'])}" if pandas.notna(
            row["last_step"]) else "")}.get(row["state"], status if isinstance(status, str) else "failed")
        if isinstance(out, str) and not os.path.relpath(out, here).startswith(".."):
            out = os.path.relpath(out, here)
        resumes = f" (continues #{int(row['resumes'])})" if pandas.notna(row["resumes"]) else ""
        table.append([str(rank), f"#{row['number']}{resumes}", state, "-" if pandas.isna(row["shown"]) else
                      f"{row['shown']:#.4g}", *[_cell(typed_value(k, row.get(f"params_{k}"))) for k in space.keys],
                      _cell(int(iters) if pandas.notna(iters) else None), _duration(row["time"]), _cell(out)])
        if row["state"] == "FAIL" and isinstance(error, str):
            errors.append(f"#{row['number']} {state}: {' '.join(error.split())}")
    markdown = tablefmt in ("github", "pipe")
    lines = [header] + ([f"best {len(shown)} of {len(ranked)} finished trials:"] if len(shown) < len(ranked) else [])
    lines += [""] * markdown + [tabulate(table, headers=headers, tablefmt=tablefmt, disable_numparse=True,
                                         colalign=["right", "left", "left"] + ["right"] * (len(headers) - 4) + ["left"])]
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
    trials, target = study.get_trials(deepcopy=False), space.objective.metric
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    varied = any(len({repr(t.params.get(k)) for t in complete}) > 1 for k in space.keys)
    skips = ["no trial has completed yet" if not complete else None,
             None if len(complete) >= 2 and varied else "importances need 2 complete trials in which some value differs",
             None if any(t.intermediate_values for t in trials) else "no trial reported an evaluation"]
    draws = [lambda: plots.plot_optimization_history(study, target_name=target),
             lambda: plots.plot_param_importances(study, target_name=target,
                                                  evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)),
             lambda: plots.plot_intermediate_values(study)]
    written = []
    for name, skip, draw in zip(PLOT_FILES, skips, draws):
        if skip:
            logger.info("%s skipped: %s", name, skip)
            continue
        try:
            axes = draw()
            if name == PLOT_FILES[2]:
                axes.set(xlabel="Iteration", ylabel=target)
            figure = axes.figure
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


def write_best_config(study, space: SearchSpace, base_cfg: CfgNode, path: str) -> str:
    """Write the best config (the base config with the best trial's values) as a YAML file that ``reid-train
    --config-file`` trains as it is, under a comment header (study, trial, value, seed, overrides); its
    OUTPUT_DIR is ``best/`` beside it. Raises ReidUserError when no trial has completed."""
    trial = _best(study)
    if trial is None:
        raise ReidUserError(f"Study {study.study_name} has no complete trial yet, so there is no best config: "
                            "let the study run more trials (run the same reid-tune command again)")
    params = {k: typed_value(k, trial.params[k]) for k in space.keys if k in trial.params}
    cfg = base_cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(overrides_list(params))
    cfg.OUTPUT_DIR = os.path.join(os.path.dirname(os.path.abspath(path)), "best")
    resumed, seed = retried_from(trial), trial.user_attrs.get("seed")
    missing = [k for k in space.keys if k not in params]
    header = [f"# Best trial of the reid-tune study '{study.study_name}': #{trial.number}"
              + (f" (continues #{resumed})" if resumed is not None else "")
              + f", {space.objective.metric} = {trial.value:.4g} ({space.objective.direction})"
              + (f", trained with SEED {seed}" if seed is not None else ""),
              "# The study's base config with these overrides (and OUTPUT_DIR below):",
              "#   " + (" ".join(overrides_list(params)) or "(none: the base config won)"),
              f"# Train it: reid-train --config-file {path}"]
    header += [f"# Not set by this trial (base values kept): {', '.join(missing)}"] * bool(missing)
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
    md += [f"Best config: [`{BEST_CONFIG_FILE}`]({BEST_CONFIG_FILE}) (train it: `reid-train --config-file "
           f"{best}`)", ""] * bool(best)
    atomic_write_text(summary, "\n".join(md) + "\n")  # first without the plots: they may fail
    plots = write_plots(study, space, out_dir)
    if plots:
        atomic_write_text(summary, "\n".join(md + [f"![{os.path.splitext(os.path.basename(p))[0]}]"
                                                   f"({os.path.basename(p)})" for p in plots]) + "\n")
    lines = [trials_table(study, space, top=10), "",
             f"Best config: {best}  (train it: reid-train --config-file {best})" if best else
             "Best config: not written yet (no trial has completed)"]
    return "\n".join(lines + [f"Plots: {', '.join(plots)}"] * bool(plots) + [f"Summary: {summary}"])
