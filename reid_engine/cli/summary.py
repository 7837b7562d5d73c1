"""The block a completed training run ends with: final metrics, where its files are, what to run next.

`format_run_summary` builds the text from the config, the final results and the command
line of the run; `reid-train` logs it on the main process after `DefaultTrainer.train()`
returns (a failed or interrupted run prints none).
"""
import glob
import os
import shlex
from typing import List, Mapping, Optional, Sequence

from ..config import CfgNode
from ..inference.rank_vis import RANK_VIS_FILE

__all__ = ["SUMMARY_METRICS", "DEFAULT_PROGRAM", "run_commands", "resume_command", "format_run_summary"]

#: the metrics the summary shows per test set (as the ReID evaluator names them)
SUMMARY_METRICS = ("Rank-1", "Rank-5", "Rank-10", "mAP", "mINP")
DEFAULT_PROGRAM = "python tools/train_net.py"


def _set_override(opts: Sequence[str], key: str, value: Optional[str]) -> List[str]:
    """`opts` (KEY VALUE pairs) without `key`, then `key value` appended (when value is not None)."""
    pairs = [(opts[i], opts[i + 1]) for i in range(0, len(opts) - 1, 2) if opts[i] != key]
    out = [x for pair in pairs for x in pair]
    return out + [key, value] if value is not None else out


def run_commands(program: str, config_file: str, opts: Sequence[str], output_dir: str, max_epoch: int,
                 launch_flags: Sequence[str] = ()) -> Mapping[str, str]:
    """The shell commands that evaluate a finished run's checkpoint and continue its training.

    Both repeat the run's own overrides (DATASETS.ROOT, MODEL.DEVICE...) so they find the same
    data; the evaluation writes its log (and ranks.png) into ``<output_dir>/eval``, the
    continued run into `output_dir` itself.

    Args:
        program: how the command is invoked (e.g. "python tools/train_net.py" or "reid-train").
        config_file: the --config-file of the run ("" for none).
        opts: the run's KEY VALUE overrides, as given.
        output_dir: the run's OUTPUT_DIR, as given (relative paths stay relative to the same folder).
        max_epoch: the run's SOLVER.MAX_EPOCH; the continue command doubles it, since a completed
            run has nothing left to train at its own length.
        launch_flags: launch flags to repeat (e.g. ["--num-gpus", "2"]).
    Returns:
        {"eval": command, "resume": command}.
    """
    base = _command_base(program, config_file, launch_flags)
    weights = os.path.join(output_dir, "model_final.pth")
    # Its own folder: evaluating must not rotate this run's config.yaml or mix into its log.
    evaluate = base + ["--eval-only"] + _set_override(_set_override(opts, "MODEL.WEIGHTS", weights), "OUTPUT_DIR",
                                                      os.path.join(output_dir, "eval"))
    resume = resume_command(program, config_file, _set_override(opts, "SOLVER.MAX_EPOCH", str(2 * max_epoch)),
                            launch_flags)
    return {"eval": shlex.join(evaluate), "resume": resume}


def resume_command(program: str, config_file: str, opts: Sequence[str], launch_flags: Sequence[str] = ()) -> str:
    """The shell command that continues a run from its ``last_checkpoint``.

    Args:
        program, launch_flags: see `run_commands`.
        config_file: the --config-file of the run ("" for none).
        opts: the KEY VALUE overrides to give it (the run's own, as given).
    Returns:
        the command, quoted for a POSIX shell.
    """
    return shlex.join(_command_base(program, config_file, launch_flags) + ["--resume"] + list(opts))


def _command_base(program: str, config_file: str, launch_flags: Sequence[str]) -> List[str]:
    base = shlex.split(program) + list(launch_flags)
    return base + ["--config-file", config_file] if config_file else base


def _latest(pattern: str) -> Optional[str]:
    """The newest file matching `pattern` (this run's, when several runs wrote into the folder)."""
    found = glob.glob(pattern)
    return max(found, key=os.path.getmtime) if found else None


def _metrics_line(name: str, metrics: Mapping) -> str:
    shown = [f"{k} {float(metrics[k]):.2f}" for k in SUMMARY_METRICS if k in metrics]
    if not shown:  # another evaluator's names: show what it reported
        shown = [f"{k} {float(v):.4g}" for k, v in metrics.items() if not isinstance(v, Mapping)]
    return f"{name}: " + "  ".join(shown)


def format_run_summary(cfg: CfgNode, results: Optional[Mapping], config_file: str, opts: Sequence[str],
                       program: str = DEFAULT_PROGRAM, launch_flags: Sequence[str] = (),
                       cwd: Optional[str] = None, since: Optional[float] = None) -> str:
    """The summary block of a completed training run.

    Args:
        cfg: the run's config (OUTPUT_DIR, TEST.RANK_VIS, SOLVER.MAX_EPOCH).
        results: the final evaluation, {test set: {metric: value}} (None or {}: none ran).
        config_file, opts: the run's --config-file and KEY VALUE overrides, as given.
        program, launch_flags: see `run_commands`.
        cwd: the folder the commands are meant to run from (default: the current one).
        since: when the run started (time.time()); older files, left by an earlier run in the
            same folder, are shown as not written by this run.
    Returns:
        the text, one item per line (no trailing newline).
    """
    out_dir = os.path.abspath(cfg.OUTPUT_DIR)
    lines = ["Run summary", "  Final results (%):"]
    if results:
        lines += ["    " + _metrics_line(name, metrics) for name, metrics in results.items()]
    else:
        lines.append("    none: no evaluation ran (DATASETS.TESTS is empty)")
    files = [("model_final.pth", os.path.join(out_dir, "model_final.pth")),
             ("last_checkpoint", os.path.join(out_dir, "last_checkpoint")),
             ("log", os.path.join(out_dir, "log.txt")),
             ("metrics.json", os.path.join(out_dir, "metrics.json")),
             ("tensorboard", _latest(os.path.join(out_dir, "events.out.tfevents.*")))]
    if cfg.TEST.RANK_VIS:
        files.append((RANK_VIS_FILE, os.path.join(out_dir, RANK_VIS_FILE)))
    lines.append(f"  Files in {out_dir}:")
    for label, path in files:
        if not path or not os.path.exists(path):
            shown = "(not written)"
        elif since is not None and os.path.getmtime(path) < since:
            shown = f"{path} (older: not written by this run)"
        else:
            shown = path
        lines.append(f"    {label + ':':<17}{shown}")
    lines.append(f"  Curves: tensorboard --logdir {shlex.quote(out_dir)}")
    commands = run_commands(program, config_file, opts, cfg.OUTPUT_DIR, cfg.SOLVER.MAX_EPOCH, launch_flags)
    lines.append(f"  Evaluate the final checkpoint (from {cwd or os.getcwd()}):")
    lines.append("    " + commands["eval"])
    lines.append(f"  Continue training to SOLVER.MAX_EPOCH {2 * cfg.SOLVER.MAX_EPOCH} (--resume restarts from "
                 "last_checkpoint; choose the length you want):")
    lines.append("    " + commands["resume"])
    return "\n".join(lines)
