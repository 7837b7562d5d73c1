"""A study's results: the ranked table, the plots and the best config (studies built in memory)."""
import datetime
import logging
import os

import pytest
from PIL import Image

from reid_engine.config import get_cfg
from reid_engine.engine.config_checks import check_config_values
from reid_engine.tune.results import (
    BEST_CONFIG_FILE,
    PLOT_FILES,
    SUMMARY_FILE,
    trials_table,
    write_best_config,
    write_plots,
    write_summary,
)
from reid_engine.tune.space import load_search_space
from reid_engine.utils.errors import ReidUserError
from tests.conftest import REPO_ROOT

optuna = pytest.importorskip("optuna")
TrialState = optuna.trial.TrialState

QUICK_CONFIG = os.path.join(REPO_ROOT, "configs", "SyntheticReID", "bagtricks_R18_quick.yml")
SPACE_TEXT = """objective: {metric: SyntheticReID/mAP, direction: DIRECTION}
params:
  SOLVER.BASE_LR: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
  MODEL.LOSSES.TRI.MARGIN: {type: float, low: 0.1, high: 0.6}
  DATALOADER.NUM_INSTANCE: {type: categorical, choices: [2, 4, 8]}
"""
START = datetime.datetime(2026, 11, 27, 4, 0, 0)


@pytest.fixture
def space(tmp_path):
    path = tmp_path / "space.yml"
    path.write_text(SPACE_TEXT.replace("DIRECTION", "maximize"))
    return load_search_space(str(path))


def _study(space, name="demo"):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name=name,
                               direction=space.objective.direction)


def _add(study, space, state, value=None, params=None, minutes=1.0, intermediate=None, retries=(), **attrs):
    """Add a finished (or running) trial with params of the space, lasting `minutes`; `retries`: the attempts
    it continues (as Optuna's retry callback records them)."""
    params = dict(params or {})
    dists = {k: d for k, d in space.params.items() if k in params}
    system_attrs = {"failed_trial": retries[0], "retry_history": list(retries)} if retries else {}
    n = len(study.get_trials(deepcopy=False))
    start = START + datetime.timedelta(hours=n)
    done = None if state == TrialState.RUNNING else start + datetime.timedelta(minutes=minutes)
    study.add_trial(optuna.trial.FrozenTrial(
        number=n, state=state, value=value, datetime_start=start, datetime_complete=done, params=params,
        distributions=dists, user_attrs=attrs, system_attrs=system_attrs, intermediate_values=dict(intermediate or {}),
        trial_id=n))
    return n


P1 = {"SOLVER.BASE_LR": 0.001, "MODEL.LOSSES.TRI.MARGIN": 0.3, "DATALOADER.NUM_INSTANCE": 4}
P2 = {"SOLVER.BASE_LR": 0.0021234567, "MODEL.LOSSES.TRI.MARGIN": 0.45, "DATALOADER.NUM_INSTANCE": 8}
P3 = {"SOLVER.BASE_LR": 0.0003, "MODEL.LOSSES.TRI.MARGIN": 0.2, "DATALOADER.NUM_INSTANCE": 2}


def _full_study(space, tmp_path):
    """#0 complete 70.0, #1 pruned at 200 (65), #2 interrupted, continued by #5, #3 complete 81.25 (best),
    #4 failed with an error, #5 complete 78.5 continuing #2, #6 pruned at 100 (50), #7 running,
    #8 pruned before its params were suggested."""
    out = str(tmp_path / "study" / "trials")
    study = _study(space)
    _add(study, space, TrialState.COMPLETE, 70.0, P1, 10, {100: 40.0, 200: 60.0, 300: 70.0},
         output_dir=f"{out}/trial_0000", iterations=300, seed=0, status="complete")
    _add(study, space, TrialState.PRUNED, None, P2, 4, {100: 45.0, 200: 65.0},
         output_dir=f"{out}/trial_0001", iterations=200, seed=0, status="pruned")
    _add(study, space, TrialState.FAIL, None, P3, 2, {100: 50.0},
         output_dir=f"{out}/trial_0002", iterations=120, seed=0, status="preempted")
    _add(study, space, TrialState.COMPLETE, 81.25, P2, 11, {100: 55.0, 200: 70.0, 300: 81.25},
         output_dir=f"{out}/trial_0003", iterations=300, seed=0, status="complete")
    _add(study, space, TrialState.FAIL, None, P1, 0.5, error="Loss became NaN at iteration 12\n(see log.txt)",
         output_dir=f"{out}/trial_0004", iterations=12, seed=0, status="failed")
    _add(study, space, TrialState.COMPLETE, 78.5, P3, 3, {100: 50.0, 200: 66.0, 300: 78.5},
         output_dir=f"{out}/trial_0002", iterations=300, seed=0, status="complete", retries=[2])
    _add(study, space, TrialState.PRUNED, None, P1, 1, {100: 50.0},
         output_dir=f"{out}/trial_0006", iterations=100, seed=0, status="pruned")
    _add(study, space, TrialState.RUNNING, None, P2, output_dir=f"{out}/trial_0007")
    _add(study, space, TrialState.PRUNED, None, {}, 0.1, output_dir=f"{out}/trial_0008", status="pruned")
    study.set_user_attr("n_trials", 10)
    return study


def _rows(table: str):
    """The table's data rows as lists of cells (split on two or more spaces)."""
    import re

    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line.replace(" ", "")) == {"-"}) + 1
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start:] if line.strip() and not line.startswith("#")]


def test_table_order_and_content(space, tmp_path):
    study = _full_study(space, tmp_path)
    table = trials_table(study, space, top=0, relative_to=str(tmp_path / "study"))
    lines = table.splitlines()
    assert lines[0] == ("Study demo: 7 of 10 trials finished (3 complete, 3 pruned, 1 failed, 1 running); "
                        "objective SyntheticReID/mAP (maximize)")
    assert lines[1].split() == ["rank", "trial", "state", "mAP", "BASE_LR", "MARGIN", "NUM_INSTANCE",
                                "iters", "time", "output"]
    rows = _rows(table)
    assert [r[1] for r in rows] == ["#3", "#5 (continues #2)", "#0", "#1", "#6", "#8", "#4"]
    assert rows[0] == ["1", "#3", "complete", "81.25", "0.002123", "0.45", "8", "300", "11m00s", "trials/trial_0003"]
    # The continuation: its own value, the interrupted attempt's folder, both attempts' time (2 + 3 min).
    assert rows[1] == ["2", "#5 (continues #2)", "complete", "78.50", "0.0003", "0.2", "2", "300", "5m00s",
                       "trials/trial_0002"]
    assert rows[2][3] == "70.00"  # 4 significant digits
    assert rows[3][2:4] == ["pruned at 200", "65.00"]  # pruned: by the last reported value
    assert rows[4][2:4] == ["pruned at 100", "50.00"]
    assert rows[5] == ["6", "#8", "pruned", "-", "-", "-", "-", "-", "6s", "trials/trial_0008"]  # no params yet
    assert rows[6][:4] == ["7", "#4", "failed", "-"]
    assert lines[-1] == "#4 failed: Loss became NaN at iteration 12 (see log.txt)"  # the error, one line
    assert "#2 " not in table.replace("continues #2", "") and "#7" not in table  # interrupted / running


def test_table_top_and_minimize(tmp_path):
    path = tmp_path / "space.yml"
    path.write_text(SPACE_TEXT.replace("DIRECTION", "minimize"))
    space = load_search_space(str(path))
    study = _full_study(space, tmp_path)
    table = trials_table(study, space, top=3)
    assert "best 3 of 7 finished trials:" in table
    assert [r[1] for r in _rows(table)] == ["#0", "#5 (continues #2)", "#3"]
    assert [r[1] for r in _rows(trials_table(study, space, top=0))] == [
        "#0", "#5 (continues #2)", "#3", "#6", "#1", "#8", "#4"]
    assert study.best_trial.number == 0


def test_table_before_any_trial_finished(space):
    study = _study(space)
    assert trials_table(study, space).endswith("\nno trial has finished yet")
    _add(study, space, TrialState.RUNNING, None, P1)
    _add(study, space, TrialState.FAIL, None, P2, status="preempted")
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING,
                                              system_attrs={"failed_trial": 1, "retry_history": [1]}))
    text = trials_table(study, space)
    assert text.splitlines() == ["Study demo: 0 trials finished (0 complete, 0 pruned, 0 failed, 1 running, "
                                 "1 interrupted, waiting to be continued); objective SyntheticReID/mAP (maximize)",
                                 "no trial has finished yet"]
    with pytest.raises(ValueError):
        study.best_trial


def test_short_column_names_stay_distinct(tmp_path):
    path = tmp_path / "space.yml"
    path.write_text("objective: {metric: SyntheticReID/mAP, direction: maximize}\nparams:\n"
                    "  MODEL.LOSSES.CE.SCALE: {type: float, low: 0.5, high: 1.0}\n"
                    "  MODEL.LOSSES.TRI.SCALE: {type: float, low: 0.5, high: 1.0}\n"
                    "  SOLVER.BASE_LR: {type: float, low: 0.001, high: 0.01}\n")
    space = load_search_space(str(path))
    study = _study(space)
    _add(study, space, TrialState.COMPLETE, 1.0, {"MODEL.LOSSES.CE.SCALE": 0.5, "MODEL.LOSSES.TRI.SCALE": 1.0,
                                                  "SOLVER.BASE_LR": 0.002}, iterations=300)
    table = trials_table(study, space)
    assert table.splitlines()[1].split()[4:7] == ["CE.SCALE", "TRI.SCALE", "BASE_LR"]
    assert _rows(table)[0][7] == "300"  # an integer column of trials_dataframe() (no trial lacks it)


def _png_ok(path):
    assert os.path.getsize(path) > 0
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 100 and image.size[1] > 100


@pytest.mark.slow  # fANOVA's first use imports scikit-learn's forests (seconds on 2 busy cores)
def test_write_plots(space, tmp_path):
    study = _full_study(space, tmp_path)
    out = str(tmp_path / "plots")
    written = write_plots(study, space, out)
    assert written == [os.path.join(out, name) for name in PLOT_FILES]
    for path in written:
        _png_ok(path)


def test_plots_that_cannot_be_drawn_are_skipped_with_a_reason(space, tmp_path, caplog):
    study = _study(space)
    _add(study, space, TrialState.PRUNED, None, P1, 1)
    with caplog.at_level(logging.INFO, logger="reid_engine.tune.results"):
        assert write_plots(study, space, str(tmp_path / "a")) == []
    assert "optimization_history.png skipped: no trial has completed yet" in caplog.text
    assert "param_importances.png skipped: importances need 2 complete trials in which some value differs" \
        in caplog.text
    assert "intermediate_values.png skipped: no trial reported an evaluation" in caplog.text

    caplog.clear()
    _add(study, space, TrialState.COMPLETE, 60.0, P1, 1)
    _add(study, space, TrialState.COMPLETE, 61.0, P1, 1)
    with caplog.at_level(logging.INFO, logger="reid_engine.tune.results"):
        written = write_plots(study, space, str(tmp_path / "b"))
    assert [os.path.basename(p) for p in written] == ["optimization_history.png"]
    _png_ok(written[0])
    assert "param_importances.png skipped: importances need 2 complete trials" in caplog.text


def _flat(cfg, prefix=""):
    out = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


@pytest.fixture(scope="module")
def base_cfg():
    cfg = get_cfg()
    cfg.merge_from_file(QUICK_CONFIG)
    cfg.freeze()
    return cfg


def test_best_config_yaml_round_trip(space, tmp_path, base_cfg):
    study = _full_study(space, tmp_path)
    path = str(tmp_path / "study" / BEST_CONFIG_FILE)
    assert write_best_config(study, space, base_cfg, path) == path
    text = open(path).read()
    head = text.splitlines()[:4]
    assert head[0] == ("# Best trial of the reid-tune study 'demo': #3, SyntheticReID/mAP = 81.25 (maximize), "
                       "trained with SEED 0")
    assert head[2] == "#   SOLVER.BASE_LR 0.0021234567 MODEL.LOSSES.TRI.MARGIN 0.45 DATALOADER.NUM_INSTANCE 8"
    assert head[3] == f"# Train it: reid-train --config-file {path}"

    loaded = get_cfg()
    loaded.merge_from_file(path)  # what reid-train --config-file does, then its value checks
    check_config_values(loaded)
    before, after = _flat(base_cfg), _flat(loaded)
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"SOLVER.BASE_LR", "MODEL.LOSSES.TRI.MARGIN", "DATALOADER.NUM_INSTANCE", "OUTPUT_DIR"}
    assert after["SOLVER.BASE_LR"] == 0.0021234567 and after["DATALOADER.NUM_INSTANCE"] == 8
    assert after["OUTPUT_DIR"] == str(tmp_path / "study" / "best")


def test_best_config_needs_a_complete_trial(space, base_cfg, tmp_path):
    study = _study(space)
    _add(study, space, TrialState.PRUNED, None, P1, 1)
    with pytest.raises(ReidUserError) as info:
        write_best_config(study, space, base_cfg, str(tmp_path / "best.yaml"))
    assert str(info.value) == ("Study demo has no complete trial yet, so there is no best config: let the study "
                               "run more trials (run the same reid-tune command again)")
    assert not os.path.exists(tmp_path / "best.yaml")


def test_write_summary(space, tmp_path, base_cfg, monkeypatch, caplog):
    # A plot that fails is one warning (the importances plot is drawn in test_write_plots: slow, scikit-learn).
    from optuna.visualization import matplotlib as optuna_plots

    def broken(*args, **kwargs):
        raise RuntimeError("no forest today")

    monkeypatch.setattr(optuna_plots, "plot_param_importances", broken)
    study = _full_study(space, tmp_path)
    out = str(tmp_path / "study")
    with caplog.at_level(logging.WARNING, logger="reid_engine.tune.results"):
        text = write_summary(study, space, base_cfg, out)
    assert "param_importances.png not drawn (RuntimeError: no forest today)" in caplog.text
    for name in (SUMMARY_FILE, BEST_CONFIG_FILE, PLOT_FILES[0], PLOT_FILES[2]):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    _png_ok(os.path.join(out, PLOT_FILES[2]))
    md = open(os.path.join(out, SUMMARY_FILE)).read()
    assert md.startswith("# reid-tune study `demo`\n")
    assert "\n\n|   rank | trial             | state         |   mAP |" in md
    assert "|      2 | #5 (continues #2) | complete      | 78.50 |" in md
    assert "\n- #4 failed: Loss became NaN at iteration 12 (see log.txt)\n" in md
    assert "![optimization_history](optimization_history.png)" in md and "param_importances" not in md
    assert "trials/trial_0003" in md  # folders relative to the study folder
    lines = text.splitlines()
    assert lines[0].startswith("Study demo: 7 of 10 trials finished")
    best = os.path.join(out, BEST_CONFIG_FILE)
    assert f"Best config: {best}  (train it: reid-train --config-file {best})" in lines
    assert lines[-1] == f"Summary: {os.path.join(out, SUMMARY_FILE)}"


def test_write_summary_without_a_complete_trial(space, tmp_path, base_cfg):
    study = _study(space)
    out = str(tmp_path / "study")
    text = write_summary(study, space, base_cfg, out)
    assert "no trial has finished yet" in text
    assert "Best config: not written yet (no trial has completed)" in text
    assert sorted(os.listdir(out)) == [SUMMARY_FILE]


def test_a_study_whose_plots_fail_still_writes_its_summary_and_best_config(space, tmp_path, base_cfg, monkeypatch,
                                                                           caplog):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    study = _full_study(space, tmp_path)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = str(tmp_path / "study")
    with caplog.at_level(logging.WARNING, logger="reid_engine.tune.results"):
        write_summary(study, space, base_cfg, out)
    assert sorted(os.listdir(out)) == [BEST_CONFIG_FILE, SUMMARY_FILE]
    assert "No plots: No module named 'matplotlib'" in caplog.text
