"""The study on Optuna's public API, in this process: the trial count, the base config first, the same
values for the same seed, the retry of a stale or preempted trial, bad storage URLs, and no private API.

No training: `run_trial` here suggests the values and returns a value computed from them (the real
trials, and real worker processes, are in test_trials.py and test_postgres.py).
"""
import math
import os
import re
import time

import pytest

optuna = pytest.importorskip("optuna")

from optuna.trial import TrialState  # noqa: E402

from reid_engine.reliability.preemption import TrainingPreempted  # noqa: E402
from reid_engine.tune import study as tune_study  # noqa: E402
from reid_engine.tune.space import Objective, SearchSpace, suggest_overrides  # noqa: E402
from reid_engine.tune.study import (  # noqa: E402
    TrialFailed,
    build_pruner,
    default_storage_url,
    finished_trials,
    open_storage,
    open_study,
    retried_from,
    study_progress,
    work_on_study,
)
from reid_engine.utils.errors import MissingPackageError, ReidUserError, UsageError  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402

dists = optuna.distributions
SPACE = SearchSpace(params={"SOLVER.BASE_LR": dists.FloatDistribution(1e-4, 1e-2, log=True),
                            "DATALOADER.NUM_INSTANCE": dists.CategoricalDistribution([2, 4, 8])},
                    objective=Objective("SyntheticReIDTiny/mAP", "maximize"))
BASE_PARAMS = {"SOLVER.BASE_LR": 3.5e-4, "DATALOADER.NUM_INSTANCE": 4}


def value_of(params) -> float:
    """Best at BASE_LR 1e-3 and NUM_INSTANCE 4."""
    return 1.0 - abs(math.log10(params["SOLVER.BASE_LR"]) + 3.0) / 4 - abs(params["DATALOADER.NUM_INSTANCE"] - 4) / 16


def new_study(tmp_path, n_trials, space=SPACE, heartbeat_s=60.0, name="s"):
    url = default_storage_url(str(tmp_path))
    storage = open_storage(url, heartbeat_s)
    return open_study(storage, name, space, n_trials, 0, BASE_PARAMS, "median"), storage, url


def run(study, storage, url, run_trial=lambda trial: value_of(suggest_overrides(trial, SPACE))):
    work_on_study(study, run_trial, storage, url, poll_s=0.05)


def test_exactly_n_trials_the_first_with_the_base_params(tmp_path):
    study, storage, url = new_study(tmp_path, 4)
    run(study, storage, url)
    trials = study.get_trials()
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    assert trials[0].params == BASE_PARAMS
    assert study_progress(study).startswith("4 of 4 trials finished (4 complete, 0 pruned, 0 failed), best #")
    run(*new_study(tmp_path, 4))  # a worker joining a finished study runs nothing more
    assert len(study.get_trials()) == 4


def test_same_seed_and_history_give_the_same_values(tmp_path):
    first, second = (new_study(tmp_path / name, 5) for name in ("a", "b"))
    for study in (first, second):
        run(*study)
    assert [t.params for t in first[0].get_trials()] == [t.params for t in second[0].get_trials()]


def test_a_failed_trial_does_not_stop_the_study_and_a_bug_does(tmp_path):
    study, storage, url = new_study(tmp_path, 3)

    def run_trial(trial):
        suggest_overrides(trial, SPACE)
        if trial.number == 1:
            trial.set_user_attr("error", "Loss became NaN")
            raise TrialFailed("Loss became NaN")
        return 0.5

    run(study, storage, url, run_trial)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    with pytest.raises(ZeroDivisionError):
        run(*new_study(tmp_path / "bug", 3), lambda trial: 1 / 0)


def test_a_preempted_trial_is_retried_with_its_values_and_the_stop_goes_on(tmp_path):
    study, storage, url = new_study(tmp_path, 2)

    def preempted(trial):
        suggest_overrides(trial, SPACE)
        trial.report(0.25, step=9)
        trial.set_user_attr("seed", 7)
        raise TrainingPreempted("stopped by SIGTERM", iteration=9)

    with pytest.raises(TrainingPreempted):
        run(study, storage, url, preempted)
    run(study, storage, url)
    first, retry, other = study.get_trials()
    assert first.state == TrialState.FAIL and retried_from(retry) == 0
    assert retry.params == first.params == BASE_PARAMS and retry.user_attrs["seed"] == 7
    assert retry.intermediate_values == {9: 0.25}  # inherited: the pruner sees the attempt's evaluations
    assert [t.number for t in finished_trials(study.get_trials())] == [1, 2]


def test_a_stale_trial_is_failed_and_retried_by_the_next_worker(tmp_path):
    study, storage, url = new_study(tmp_path, 2, heartbeat_s=1)
    storage.record_heartbeat(storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("s"), study.ask().number))  # a worker claimed #0, then got kill -9
    started = time.monotonic()
    run(study, storage, url)  # polls until #0 is 3 x 1 s silent, then runs its retry
    trials = study.get_trials()
    assert time.monotonic() - started >= 2.0
    assert trials[0].state == TrialState.FAIL and [retried_from(t) for t in trials] == [None, None, 0]
    assert trials[2].params == BASE_PARAMS and len(finished_trials(trials)) == 2


def test_a_different_search_on_the_same_study_is_one_line(tmp_path):
    new_study(tmp_path, 5)
    with pytest.raises(UsageError) as info:
        new_study(tmp_path, 6)
    message = str(info.value)
    assert "\n" not in message and "study s has 5 trials over keys" in message and "asks for 6 trials" in message
    assert "another --study-name" in message


def test_a_study_that_never_became_ready_is_one_line(tmp_path, monkeypatch):
    storage = open_storage(default_storage_url(str(tmp_path)), heartbeat_s=1)
    optuna.create_study(study_name="half", storage=storage)  # as if its creator died before its attrs
    monkeypatch.setattr(tune_study, "READY_TIMEOUT_S", 0.3)
    with pytest.raises(ReidUserError, match="creator never finished setting it up"):
        open_study(storage, "half", SPACE, 3, 0, BASE_PARAMS, "median")


@pytest.mark.parametrize("url, error, expected", [
    ("not a url", UsageError, "cannot read the study storage URL not a url (--storage)"),
    ("postgresql+psycopg://postgres:s3cret@127.0.0.1:55433x/db", UsageError,
     "cannot read the study storage URL postgresql+psycopg://postgres:***@127.0.0.1:55433x/db (--storage)"),
    ("me:s3cret@localhost/db", UsageError, "cannot read the study storage URL me:***@localhost/db (--storage)"),
    ("nosuchdb://h/x", UsageError, "unknown kind of database in the study storage URL nosuchdb://h/x"),
    ("mysql+pymysql://me:s3cret@localhost/x", MissingPackageError,
     "the study storage mysql+pymysql://me:***@localhost/x needs its database driver"),
    ("postgresql+psycopg://me:s3cret@/x?host=/nonexistent-dir&port=1", ReidUserError,
     "cannot open the study storage postgresql+psycopg://me:***@/x?host=/nonexistent-dir&port=1 (--storage): "),
])
def test_a_bad_storage_url_is_one_line_without_the_password(monkeypatch, url, error, expected):
    monkeypatch.setattr(tune_study, "OPEN_STORAGE_TRIES", 1)
    pytest.importorskip("psycopg")
    if url.startswith("mysql"):
        try:
            import pymysql  # noqa: F401
            pytest.skip("pymysql is installed: no missing driver to report")
        except ImportError:
            pass
    with pytest.raises(error) as info:
        open_storage(url)
    message = str(info.value)
    assert message.startswith(expected) and "\n" not in message and "s3cret" not in message, message


def test_pruners_by_name():
    assert isinstance(build_pruner("median"), optuna.pruners.MedianPruner)
    assert isinstance(build_pruner("hyperband"), optuna.pruners.HyperbandPruner)
    assert isinstance(build_pruner("none"), optuna.pruners.NopPruner)
    with pytest.raises(UsageError, match="unknown pruner 'asha' \\(--pruner\\): use one of median, hyperband, none"):
        build_pruner("asha")


def test_default_storage_is_sqlite_in_the_study_folder(tmp_path):
    assert default_storage_url(str(tmp_path / "x")) == f"sqlite:///{tmp_path}/x/study.db"
    open_storage(default_storage_url(str(tmp_path / "x" / "y")))  # creates its folder
    assert (tmp_path / "x" / "y" / "study.db").is_file()


def test_no_private_api_of_optuna_is_used():
    """Optuna's private attributes and constructors change without notice: reid_engine uses none of them."""
    pattern = re.compile(r"\._storage\b|\._trial_id\b|(?<![\w])Trial\(")
    hits = []
    for folder, _, files in os.walk(os.path.join(REPO_ROOT, "reid_engine")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    hits += [f"{path}:{i}: {line.strip()}" for i, line in enumerate(f, 1) if pattern.search(line)]
    assert not hits, hits
